/* The target's verification costs, measured once per run for replay's modeled speedup. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/replay.h"

static double minimum(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The median of v[0..n) (sorts v). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Repetitions per size: after one untimed warm-up (first touch of buffers and tree slots), at
 * least `reps` and until COST_MIN_S has been timed, at most COST_MAX_REPS. The cost is the
 * fastest repetition: load on the machine only ever adds time, and a forward of a small model
 * lasts less than one scheduler slice, so a median of a few can be a preemption. */
#define COST_MIN_S 0.025
#define COST_MAX_REPS 64

static int add_size(int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return n;
    int i = n;
    while (i > 0 && v[i - 1] > x) v[i] = v[i - 1], i--;
    v[i] = x;
    return n + 1;
}

int eval_costs_measure(eval_costs *c, const dfl_model *m, dfl_draft_if *dr, const int32_t *prompt, int n_prompt,
                       const int *blocks, int n_blocks, const int *budgets, int n_budgets, int reps) {
    memset(c, 0, sizeof *c);
    if (reps < 1 || n_prompt < 1) return DFL_OK;
    if (n_blocks + 1 > EVAL_MAX_COSTS || n_budgets > EVAL_MAX_COSTS) return dfl_seterr("costs: too many sizes");
    c->chain_n[0] = 1;
    c->n_chain = 1;
    int maxb = 2, max_nodes = 0;
    for (int i = 0; i < n_blocks; i++) {
        c->n_chain = add_size(c->chain_n, c->n_chain, blocks[i]);
        maxb = blocks[i] > maxb ? blocks[i] : maxb;
    }
    for (int i = 0; i < n_budgets; i++)
        if (budgets[i] > 0) {
            c->n_tree = add_size(c->tree_budget, c->n_tree, budgets[i]);
            if (budgets[i] <= DDTREE_MAX_BUDGET && budgets[i] + 1 > max_nodes) max_nodes = budgets[i] + 1;
        }
    const int L = n_prompt < 512 ? n_prompt : 512, B = blocks[0] < maxb ? blocks[0] : maxb;
    int batch = L > maxb ? L : maxb;
    batch = batch > max_nodes ? batch : max_nodes;
    if (reps > COST_MAX_REPS) reps = COST_MAX_REPS;
    const int max_ctx = L + (COST_MAX_REPS + 1) * (c->n_chain + c->n_tree + 1) + batch + 8;
    const int V = m->cfg.vocab, H = m->cfg.hidden, nf = dr->n_feature_layers;
    dfl_target_state s;
    if (target_state_init(&s, m, max_ctx, batch, 1) != DFL_OK) return dfl_preperr("measuring verification costs");
    const int vrows = maxb > max_nodes ? maxb : max_nodes;
    float *logits = dfl_alloc((size_t)B * V * sizeof(float)), *feat = malloc((size_t)L * nf * H * sizeof(float));
    float *vlog = dfl_alloc((size_t)vrows * V * sizeof(float)); /* verification logits (scratch) */
    int32_t *vids = malloc((size_t)vrows * sizeof *vids);
    /* verifications as the greedy online loop runs them (replay is greedy): each row's argmax, the
     * logits scratch (kn_matmul_argmax may skip most lm_head rows) */
    const dfl_fwd_out vo = {.logits = vlog, .argmax = vids, .logits_scratch = 1};
    double *t = malloc((size_t)COST_MAX_REPS * sizeof(double));
    int32_t *toks = malloc((size_t)batch * sizeof(int32_t));
    dfl_tree tree = {0};
    /* a real draft on the first prompt gives the trees a realistic shape */
    dfl_capture cap = {.n_layers = nf, .layers = dr->feature_layers, .out = feat};
    const dfl_feat fv = dfl_feat_view(feat, L, nf * H);
    int32_t anchor = 0;
    int rc = DFL_ERR;
    if (!logits || !feat || !vlog || !vids || !t || !toks) {
        dfl_seterr("out of memory measuring verification costs");
        goto done;
    }
    s.no_record = 1;
    dr->reset(dr->ctx);
    if (model_forward(&s, prompt, L, logits, 1, &cap) || dr->add_context(dr->ctx, &fv, prompt, L)) goto done;
    anchor = kn_argmax(logits, V);
    if (dr->draft(dr->ctx, anchor, B, logits)) goto done;
    dr->reset(dr->ctx);
    toks[0] = anchor;
    for (int k = 1; k < batch; k++) toks[k] = kn_argmax(logits + (size_t)((k - 1) % (B - 1)) * V, V);
    for (int k = 0; k < B - 1; k++) kn_softmax(logits + (size_t)k * V, V);
    c->context = L;
    c->reps = 0; /* the most repetitions any size took */
    for (int i = 0; i < c->n_chain; i++) {
        const int n = c->chain_n[i];
        double total = 0;
        int r = -1; /* -1: the warm-up */
        for (; r < reps || (total < COST_MIN_S && r < COST_MAX_REPS); r++) {
            const int start = s.n_past;
            const double t0 = dfl_now();
            s.no_record = n == 1; /* a decode step keeps no record; a verification is rolled back */
            if (model_forward_ex(&s, toks, NULL, n, &vo)) goto done;
            if (n > 1 && target_state_rollback(&s, start + 1)) goto done;
            if (r >= 0) total += t[r] = dfl_now() - t0;
        }
        c->chain_s[i] = minimum(t, r);
        c->chain_med[i] = median(t, r);
        c->reps = r > c->reps ? r : c->reps;
    }
    s.no_record = 1;
    for (int i = 0; i < c->n_tree; i++) {
        const int N = c->tree_budget[i];
        c->tree_s[i] = -1;
        if (N > DDTREE_MAX_BUDGET) {
            snprintf(c->note, sizeof c->note, "budgets above %d are not verified on the target: no cost",
                     DDTREE_MAX_BUDGET);
            continue;
        }
        if (s.tree_cap < N + 1 && target_state_enable_tree(&s, N + 1) != DFL_OK) {
            snprintf(c->note, sizeof c->note, "budget %d: %s", N, dfl_errmsg());
            continue;
        }
        if (ddtree_alloc(&tree, N) || ddtree_build(&tree, anchor, logits, B - 1, V, N)) goto done;
        const int root[1] = {0};
        double total = 0;
        int r = -1;
        for (; r < reps || (total < COST_MIN_S && r < COST_MAX_REPS); r++) {
            const double t0 = dfl_now();
            if (model_forward_ex(&s, tree.token, tree.parent, tree.n, &vo) || target_state_tree_commit(&s, root, 1))
                goto done;
            if (r >= 0) total += t[r] = dfl_now() - t0;
        }
        ddtree_free(&tree);
        c->tree_s[i] = minimum(t, r);
        c->tree_med[i] = median(t, r);
        c->reps = r > c->reps ? r : c->reps;
    }
    c->ok = 1;
    rc = DFL_OK;
done:
    ddtree_free(&tree);
    free(logits), free(feat), free(vlog), free(vids), free(t), free(toks);
    target_state_free(&s);
    return rc;
}

/* Append one failed check to why ("; " between them). */
static void add_why(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_why(char *why, size_t n, const char *fmt, ...) {
    size_t used = strlen(why);
    if (used && used + 2 < n) snprintf(why + used, n - used, "; "), used += 2;
    if (used + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + used, n - used, fmt, ap);
    va_end(ap);
}

int eval_costs_check(const eval_costs *c, double ar_step_s, char *why, size_t n) {
    why[0] = 0;
    if (!c->ok || c->n_chain < 1 || c->chain_n[0] != 1) return 1; /* nothing priced, nothing to check */
    const double dec = c->chain_s[0], ms = 1e3;
    for (int i = 1; i < c->n_chain; i++)
        if (c->chain_s[i] < EVAL_COST_NOISE * dec)
            add_why(why, n, "a verification of %d tokens (%.3f ms) costs less than a decode step (%.3f ms)",
                    c->chain_n[i], c->chain_s[i] * ms, dec * ms);
    for (int i = 0; i < c->n_tree; i++)
        if (c->tree_s[i] >= 0 && c->tree_s[i] < EVAL_COST_NOISE * dec)
            add_why(why, n, "a tree of budget %d (%.3f ms) costs less than a decode step (%.3f ms)", c->tree_budget[i],
                    c->tree_s[i] * ms, dec * ms);
    for (int i = 0; i < c->n_chain; i++)
        if (c->chain_med[i] > EVAL_COST_SPREAD * c->chain_s[i])
            add_why(why, n, "the timed repetitions of the %d-token forward spread: median %.3f ms, fastest %.3f ms",
                    c->chain_n[i], c->chain_med[i] * ms, c->chain_s[i] * ms);
    for (int i = 0; i < c->n_tree; i++)
        if (c->tree_s[i] >= 0 && c->tree_med[i] > EVAL_COST_SPREAD * c->tree_s[i])
            add_why(why, n, "the timed repetitions of the budget-%d tree spread: median %.3f ms, fastest %.3f ms",
                    c->tree_budget[i], c->tree_med[i] * ms, c->tree_s[i] * ms);
    if (ar_step_s > 0 && (ar_step_s < EVAL_COST_AR_LO * dec || ar_step_s > EVAL_COST_AR_HI * dec))
        add_why(why, n,
                "the decode cost (%.3f ms, measured at the start) is far from the autoregressive step the run "
                "measured (%.3f ms per token)",
                dec * ms, ar_step_s * ms);
    return why[0] == 0;
}
