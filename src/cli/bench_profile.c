/* dfl bench --parts profile (bench_profile.h). */
#include "cli/bench_profile.h"

#include <stdio.h>
#include <stdlib.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"

static const char *const fwd_names[BP_COUNT] = {"decode", "verify", "tree", "draft"};

float *bench_tree_probs(int D, int V) {
    float *probs = malloc((size_t)D * V * sizeof(float));
    if (!probs) return NULL;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)D * V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        probs[i] = 8.0f * (float)(x >> 40) / (float)(1 << 24);
    }
    for (int d = 0; d < D; d++) probs[(size_t)d * V + (d * 7919) % V] += 14.0f; /* a likely draft per depth */
    for (int d = 0; d < D; d++) kn_softmax(probs + (size_t)d * V, V);
    return probs;
}

/* One forward of kind k with the profile counting; then back to the context (a decode step stays). */
static int profile_one(dfl_target_state *s, const dfl_draft_if *dif, int k, const int32_t *toks, int nv, int B,
                       const dfl_tree *t, float *logits, kn_prof *q, double *dt) {
    const int base = s->n_past, root[1] = {0};
    int32_t ids[BP_TREE_BUDGET + 1 > DFL_MAX_BLOCK ? BP_TREE_BUDGET + 1 : DFL_MAX_BLOCK];
    /* the target's forwards as greedy decoding runs them: each row's argmax, the logits scratch */
    const dfl_fwd_out fo = {.logits = logits, .argmax = ids, .last_only = k == BP_DECODE, .logits_scratch = 1};
    kn_prof_start();
    const double t0 = dfl_now();
    int rc;
    if (k == BP_TREE) rc = model_forward_ex(s, t->token, t->parent, t->n, &fo);
    else if (k == BP_DRAFT) rc = dif->draft(dif->ctx, toks[0], B, logits);
    else rc = model_forward_ex(s, toks, NULL, k == BP_DECODE ? 1 : nv, &fo);
    *dt = dfl_now() - t0;
    kn_prof_stop(q);
    if (rc != DFL_OK) return DFL_ERR;
    if (k == BP_TREE) return target_state_tree_commit(s, root, 1);
    return k == BP_VERIFY ? target_state_rollback(s, base) : DFL_OK; /* a draft leaves no trace */
}

int bench_profile_run(dfl_target_state *s, const dfl_draft_if *dif, const int32_t *toks, int nv, int B, int reps,
                      bench_prof *p) {
    const int V = s->m->cfg.vocab, trees = s->tree_cap > 0;
    int rows = nv > BP_TREE_BUDGET + 1 ? nv : BP_TREE_BUDGET + 1;
    rows = rows > B ? rows : B;
    float *logits = dfl_alloc((size_t)rows * V * sizeof(float)), *probs = trees ? bench_tree_probs(B - 1, V) : NULL;
    dfl_tree t = {0};
    int rc = DFL_ERR;
    const int no_record = s->no_record;
    if (!logits || (trees && (!probs || ddtree_alloc(&t, BP_TREE_BUDGET) != DFL_OK))) {
        dfl_seterr("out of memory for the profile's buffers");
        goto done;
    }
    if (trees && ddtree_build(&t, toks[0], probs, B - 1, V, BP_TREE_BUDGET) != DFL_OK) goto done;
    for (int k = 0; k < BP_COUNT; k++) {
        if ((k == BP_TREE && !trees) || (k == BP_DRAFT && !dif)) continue;
        p->n[k] = k == BP_DECODE ? 1 : k == BP_VERIFY ? nv : k == BP_TREE ? t.n : B;
        uint64_t bytes = 0;
        double mm_s = 0;
        for (int r = 0; r < reps + 1; r++) { /* the first run warms up */
            kn_prof q;
            double dt;
            s->no_record = k == BP_DECODE; /* plain decoding keeps no record */
            const int ok = profile_one(s, dif, k, toks, nv, B, &t, logits, &q, &dt) == DFL_OK;
            s->no_record = no_record;
            if (!ok) goto done;
            if (r == 0) continue;
            p->total_ms[k] += 1e3 * dt / reps;
            for (int op = 0; op < KN_OP_COUNT; op++) p->op_ms[k][op] += 1e3 * q.seconds[op] / reps;
            bytes += q.matmul_bytes;
            mm_s += q.seconds[KN_OP_MATMUL] + q.seconds[KN_OP_LM_HEAD];
        }
        p->matmul_gbps[k] = mm_s > 0 ? bytes / mm_s / 1e9 : 0;
    }
    rc = DFL_OK;
done:
    ddtree_free(&t);
    free(logits), free(probs);
    return rc;
}

/* Time of the forward outside the counted kernel calls. */
static double other_ms(const bench_prof *p, int k) {
    double o = p->total_ms[k];
    for (int op = 0; op < KN_OP_COUNT; op++) o -= p->op_ms[k][op];
    return o;
}

void bench_profile_print(const bench_prof *p) {
    char head[BP_COUNT][32];
    for (int k = 0; k < BP_COUNT; k++)
        if (k == BP_DECODE) snprintf(head[k], sizeof head[k], "decode");
        else snprintf(head[k], sizeof head[k], "%s(%d)", fwd_names[k], p->n[k]);
    printf("profile    ms per forward by kind of kernel call (mean; other: the forward outside them)\n");
    printf("           %-24s", "kind");
    for (int k = 0; k < BP_COUNT; k++)
        if (p->n[k]) printf(" %12s", head[k]);
    printf("\n");
    for (int op = 0; op <= KN_OP_COUNT + 1; op++) {
        printf("           %-24s", op < KN_OP_COUNT ? kn_op_name((kn_op)op) : op == KN_OP_COUNT ? "other" : "total");
        for (int k = 0; k < BP_COUNT; k++)
            if (p->n[k])
                printf(" %12.2f", op < KN_OP_COUNT    ? p->op_ms[k][op]
                                  : op == KN_OP_COUNT ? other_ms(p, k)
                                                      : p->total_ms[k]);
        printf("\n");
    }
    printf("           %-24s", "x decode");
    for (int k = 0; k < BP_COUNT; k++)
        if (p->n[k]) printf(" %12.3f", p->total_ms[k] / p->total_ms[BP_DECODE]);
    printf("\n           %-24s", "products' weights GB/s");
    for (int k = 0; k < BP_COUNT; k++)
        if (p->n[k]) printf(" %12.2f", p->matmul_gbps[k]);
    printf("\n");
    for (int k = BP_VERIFY; k <= BP_TREE; k++) { /* what the extra time over a decode step went to */
        if (!p->n[k]) continue;
        double d[KN_OP_COUNT + 1]; /* each kind's extra ms, then other's */
        for (int op = 0; op < KN_OP_COUNT; op++) d[op] = p->op_ms[k][op] - p->op_ms[BP_DECODE][op];
        d[KN_OP_COUNT] = other_ms(p, k) - other_ms(p, BP_DECODE);
        printf("           %s over decode: %+.2f ms; the most in", head[k], p->total_ms[k] - p->total_ms[BP_DECODE]);
        for (int i = 0; i < 3; i++) { /* the three largest, largest first */
            int best = 0;
            for (int op = 1; op <= KN_OP_COUNT; op++) best = d[op] > d[best] ? op : best;
            printf("%s %s %+.2f", i ? "," : "", best < KN_OP_COUNT ? kn_op_name((kn_op)best) : "other", d[best]);
            d[best] = -1e30;
        }
        printf("\n");
    }
}

void bench_profile_json(const bench_prof *p) {
    printf(", \"profile\": {");
    int first = 1;
    for (int k = 0; k < BP_COUNT; k++) {
        if (!p->n[k]) continue;
        printf("%s\"%s\": {\"tokens\": %d, \"total_ms\": %.4f, \"other_ms\": %.4f, \"matmul_gbps\": %.3f",
               first ? "" : ", ", fwd_names[k], p->n[k], p->total_ms[k], other_ms(p, k), p->matmul_gbps[k]);
        for (int op = 0; op < KN_OP_COUNT; op++) printf(", \"%s_ms\": %.4f", kn_op_key((kn_op)op), p->op_ms[k][op]);
        printf("}");
        first = 0;
    }
    printf("}");
}
