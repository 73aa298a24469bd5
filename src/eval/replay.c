/* Replay evaluation: truths with their features, the draft cache, the recording drafter
 * wrapper and the drafter-only replay of chain and DDTree rounds (include/dfl/replay.h). */
#include "dfl/replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/round.h"

/* ---- truth ------------------------------------------------------------------------------ */

static int int_cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int eval_truth_init(eval_truth *t, int H, const int *layers, int n_layers) {
    memset(t, 0, sizeof *t);
    if (n_layers < 1 || n_layers > EVAL_MAX_FEAT_LAYERS)
        return dfl_seterr("features of %d layers: must be in [1, %d]", n_layers, EVAL_MAX_FEAT_LAYERS);
    t->H = H;
    memcpy(t->layers, layers, (size_t)n_layers * sizeof *layers);
    qsort(t->layers, (size_t)n_layers, sizeof *t->layers, int_cmp);
    for (int i = 0; i < n_layers; i++)
        if (i == 0 || t->layers[i] != t->layers[t->n_layers - 1]) t->layers[t->n_layers++] = t->layers[i];
    return DFL_OK;
}

void eval_truth_free(eval_truth *t) {
    free(t->prompt), free(t->ids), free(t->feat);
    const int H = t->H, nl = t->n_layers;
    int layers[EVAL_MAX_FEAT_LAYERS];
    memcpy(layers, t->layers, sizeof layers);
    memset(t, 0, sizeof *t);
    t->H = H, t->n_layers = nl;
    memcpy(t->layers, layers, sizeof layers);
}

int eval_truth_add_rows(eval_truth *t, const float *rows, int n) {
    const size_t w = (size_t)t->n_layers * t->H;
    if (t->n_rows + n > t->cap_rows) {
        int cap = t->cap_rows ? t->cap_rows : 256;
        while (cap < t->n_rows + n) cap *= 2;
        float *f = realloc(t->feat, (size_t)cap * w * sizeof(float));
        if (!f)
            return dfl_seterr("out of memory for the features of %d positions (%.1f MiB)", cap,
                              (double)cap * w * sizeof(float) / 1048576.0);
        t->feat = f, t->cap_rows = cap;
    }
    memcpy(t->feat + (size_t)t->n_rows * w, rows, (size_t)n * w * sizeof(float));
    t->n_rows += n;
    return DFL_OK;
}

int eval_truth_set(eval_truth *t, const int32_t *prompt, int n_prompt, const int32_t *ids, int n, int n_ext,
                   int eos_stop) {
    if (n_prompt < 1 || n < 1) return dfl_seterr("truth: empty prompt or output");
    if (t->n_rows < n_prompt + n - 1)
        return dfl_seterr("truth: features of %d positions, but the prompt (%d) and output (%d tokens) need %d",
                          t->n_rows, n_prompt, n, n_prompt + n - 1);
    free(t->prompt), free(t->ids);
    t->prompt = malloc((size_t)n_prompt * sizeof *t->prompt);
    t->ids = malloc((size_t)(n + n_ext) * sizeof *t->ids);
    if (!t->prompt || !t->ids) return dfl_seterr("out of memory for a truth");
    memcpy(t->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    memcpy(t->ids, ids, (size_t)(n + n_ext) * sizeof *ids);
    t->n_prompt = n_prompt, t->n = n, t->n_ext = n_ext, t->eos_stop = eos_stop;
    t->n_rows = n_prompt + n - 1;
    return DFL_OK;
}

int eval_truth_column(const eval_truth *t, int layer) {
    for (int i = 0; i < t->n_layers; i++)
        if (t->layers[i] == layer) return i;
    return -1;
}

/* ---- draft cache ------------------------------------------------------------------------ */

int eval_draft_cache_init(eval_draft_cache *c, int K, int V, int max_block) {
    memset(c, 0, sizeof *c);
    c->K = K < V ? K : V;
    c->V = V;
    c->max_block = max_block;
    if (c->K > 0 && !(c->probs = malloc((size_t)(max_block - 1) * V * sizeof(float))))
        return dfl_seterr("out of memory for the draft cache");
    return DFL_OK;
}

void eval_draft_cache_clear(eval_draft_cache *c) {
    for (int i = 0; i < c->n; i++) free(c->d[i].argmax), free(c->d[i].top), free(c->d[i].toplp);
    c->n = 0;
}

void eval_draft_cache_free(eval_draft_cache *c) {
    eval_draft_cache_clear(c);
    free(c->d), free(c->probs);
    memset(c, 0, sizeof *c);
}

const eval_draft *eval_draft_cache_get(const eval_draft_cache *c, int start, int bs) {
    for (int i = c->n - 1; i >= 0; i--) /* lookups come in increasing start: search from the end */
        if (c->d[i].start == start && c->d[i].bs == bs) return &c->d[i];
    return NULL;
}

/* A new entry for (start, bs) at the cache's end, its arrays allocated (NULL: refused or out
 * of memory, the message set). */
static eval_draft *cache_new(eval_draft_cache *c, int start, int bs) {
    if (bs < 2 || bs > c->max_block) {
        dfl_seterr("draft cache: block of %d outside [2, %d]", bs, c->max_block);
        return NULL;
    }
    if (c->n == c->cap) {
        const int cap = c->cap ? 2 * c->cap : 64;
        eval_draft *d = realloc(c->d, (size_t)cap * sizeof *d);
        if (!d) {
            dfl_seterr("out of memory for the draft cache");
            return NULL;
        }
        c->d = d, c->cap = cap;
    }
    const int D = bs - 1, K = c->K;
    eval_draft e = {.start = start, .bs = bs, .argmax = malloc((size_t)D * sizeof(int32_t))};
    if (K > 0) e.top = malloc((size_t)D * K * sizeof(int32_t)), e.toplp = malloc((size_t)D * K * sizeof(double));
    if (!e.argmax || (K > 0 && (!e.top || !e.toplp))) {
        free(e.argmax), free(e.top), free(e.toplp);
        dfl_seterr("out of memory for the draft cache");
        return NULL;
    }
    c->d[c->n] = e;
    return &c->d[c->n];
}

/* probs: the softmax's scratch [bs-1, V], or the logits themselves (overwritten). */
static int cache_summarize(eval_draft_cache *c, int start, int bs, const float *logits, float *probs) {
    if (eval_draft_cache_get(c, start, bs)) return DFL_OK;
    eval_draft *e = cache_new(c, start, bs);
    if (!e) return DFL_ERR;
    /* chain: argmax of the logits (as the online loop takes it); DDTree: the online loop's
     * softmax of the same logits, then the top K */
    const dfl_draft_top out = {.K = c->K, .argmax = e->argmax, .top = e->top, .toplp = e->toplp};
    if (dfl_draft_summarize(logits, bs - 1, c->V, probs, &out)) {
        free(e->argmax), free(e->top), free(e->toplp);
        return DFL_ERR;
    }
    c->n++;
    return DFL_OK;
}

int eval_draft_cache_put(eval_draft_cache *c, int start, int bs, const float *logits) {
    return cache_summarize(c, start, bs, logits, c->probs);
}

int eval_draft_cache_take(eval_draft_cache *c, int start, int bs, float *logits) {
    return cache_summarize(c, start, bs, logits, logits);
}

int eval_draft_cache_put_top(eval_draft_cache *c, int start, int bs, const dfl_draft_top *src) {
    if (eval_draft_cache_get(c, start, bs)) return DFL_OK;
    if (src->K < c->K) return dfl_seterr("draft cache: %d candidates a row given, %d kept", src->K, c->K);
    eval_draft *e = cache_new(c, start, bs);
    if (!e) return DFL_ERR;
    memcpy(e->argmax, src->argmax, (size_t)(bs - 1) * sizeof *e->argmax);
    for (int k = 0; k < bs - 1 && c->K > 0; k++) { /* the first K of a longer list are the top K */
        memcpy(e->top + (size_t)k * c->K, src->top + (size_t)k * src->K, (size_t)c->K * sizeof *e->top);
        memcpy(e->toplp + (size_t)k * c->K, src->toplp + (size_t)k * src->K, (size_t)c->K * sizeof *e->toplp);
    }
    c->n++;
    return DFL_OK;
}

/* ---- recording wrapper ------------------------------------------------------------------ */

static double ema(double avg, double x, int n) { return n == 0 ? x : 0.7 * avg + 0.3 * x; }

/* Host rows of a feature handle (the truth records them), read into feat_in when on a device. */
static const float *rec_rows(eval_recorder *r, const dfl_feat *f, int n) {
    if (!f->host && n > r->feat_cap) {
        float *p = realloc(r->feat_in, (size_t)n * f->width * sizeof(float));
        if (!p) return dfl_seterr("out of memory recording features"), NULL;
        r->feat_in = p, r->feat_cap = n;
    }
    return dfl_feat_host_rows(f, 0, n, r->feat_in);
}

static int rec_add(void *ctx, const dfl_feat *ff, const int32_t *tokens, int n) {
    eval_recorder *r = ctx;
    const eval_truth *t = r->truth;
    const int H = t->H, ni = r->inner.n_feature_layers;
    const double t0 = dfl_now();
    const float *feat = rec_rows(r, ff, n);
    if (!feat) return DFL_ERR;
    const int in_prefill = r->inner.context_len(r->inner.ctx) < r->n_prompt;
    if (r->adaptive && !in_prefill) { /* a round ends here: what it cost and what it gave */
        if (r->skipped) {
            if (!r->fixed_costs) r->ema_decode_s = ema(r->ema_decode_s, t0 - r->t_round0, r->n_ar);
            r->n_ar++;
        } else if (r->t_drafted > 0) {
            if (!r->fixed_costs) r->ema_verify_s = ema(r->ema_verify_s, t0 - r->t_drafted, r->n_spec);
            r->ema_tokens = ema(r->ema_tokens, n, r->n_spec), r->n_spec++;
        }
        r->skipped = 0, r->t_drafted = 0;
    }
    if (eval_truth_add_rows(r->truth, feat, n)) return DFL_ERR;
    if (n > r->rows_cap) {
        float *p = realloc(r->rows, (size_t)n * ni * H * sizeof(float));
        if (!p) return dfl_seterr("out of memory recording features");
        r->rows = p, r->rows_cap = n;
    }
    for (int p = 0; p < n; p++)
        for (int i = 0; i < ni; i++)
            memcpy(r->rows + ((size_t)p * ni + i) * H, feat + ((size_t)p * t->n_layers + r->map[i]) * H,
                   (size_t)H * sizeof(float));
    const double t1 = dfl_now();
    *(in_prefill ? &r->overhead_prefill_s : &r->overhead_s) += t1 - t0;
    const dfl_feat rows = dfl_feat_view(r->rows, n, ni * H);
    if (r->inner.add_context(r->inner.ctx, &rows, tokens, n)) return DFL_ERR;
    if (r->cache) r->cache->ctx_s += dfl_now() - t1, r->cache->ctx_rows += n;
    return DFL_OK;
}

static int rec_draft(void *ctx, int32_t anchor, int B, float *logits) {
    eval_recorder *r = ctx;
    const int start = r->inner.context_len(r->inner.ctx);
    const double t0 = dfl_now();
    if (r->inner.draft(r->inner.ctx, anchor, B, logits)) return DFL_ERR;
    const double t1 = dfl_now();
    r->t_drafted = t1;
    if (!r->cache) return DFL_OK;
    r->cache->draft_s += t1 - t0, r->cache->drafts++;
    const int rc = eval_draft_cache_put(r->cache, start, B, logits);
    r->overhead_s += dfl_now() - t1;
    return rc;
}

/* The inner drafter's block summarized with as many candidates as the loop and the cache want,
 * each given its own (the top K of a list are its first K). */
static int rec_draft_top(void *ctx, int32_t anchor, int B, const dfl_draft_top *out, float *logits) {
    eval_recorder *r = ctx;
    const int start = r->inner.context_len(r->inner.ctx), D = B - 1;
    const int Kc = r->cache ? r->cache->K : 0, K = out->K > Kc ? out->K : Kc;
    const size_t need = (size_t)D * r->V;
    if (need > r->lbuf_cap || (size_t)D * K > r->top_cap) {
        float *l = need > r->lbuf_cap ? realloc(r->lbuf, need * sizeof *l) : r->lbuf;
        if (l) r->lbuf = l, r->lbuf_cap = need > r->lbuf_cap ? need : r->lbuf_cap;
        int32_t *t = realloc(r->top, ((size_t)D * K + 1) * sizeof *t);
        if (t) r->top = t;
        double *lp = realloc(r->toplp, ((size_t)D * K + 1) * sizeof *lp);
        if (lp) r->toplp = lp;
        if (!l || !t || !lp) return dfl_seterr("out of memory recording drafts");
        r->top_cap = (size_t)D * K;
    }
    int32_t argmax[DFL_MAX_BLOCK];
    const dfl_draft_top all = {.K = K, .argmax = argmax, .top = r->top, .toplp = r->toplp};
    const double t0 = dfl_now();
    /* logits wanted: drafted there, the softmax in lbuf; else drafted into lbuf, softmax in place */
    if (dfl_draft_topk(&r->inner, anchor, B, r->V, &all, logits ? logits : r->lbuf, logits != NULL, r->lbuf))
        return DFL_ERR;
    const double t1 = dfl_now();
    r->t_drafted = t1;
    memcpy(out->argmax, argmax, (size_t)D * sizeof *argmax);
    for (int k = 0; k < D && out->K > 0; k++) {
        memcpy(out->top + (size_t)k * out->K, all.top + (size_t)k * K, (size_t)out->K * sizeof *out->top);
        memcpy(out->toplp + (size_t)k * out->K, all.toplp + (size_t)k * K, (size_t)out->K * sizeof *out->toplp);
    }
    if (!r->cache) return DFL_OK;
    r->cache->draft_s += t1 - t0, r->cache->drafts++;
    const int rc = eval_draft_cache_put_top(r->cache, start, B, &all);
    r->overhead_s += dfl_now() - t1;
    return rc;
}

/* Speculate when a round's verification commits more tokens per second than decode steps do
 * (the draft is not counted: replay would draft at these positions anyway). */
static int rec_skip(void *ctx) {
    eval_recorder *r = ctx;
    r->t_round0 = dfl_now();
    int skip = 0;
    if (r->n_spec < 2) skip = 0;                       /* measure speculation first */
    else if (r->n_ar < 1 && !r->fixed_costs) skip = 1; /* then one decode step */
    else if (r->ema_tokens * r->ema_decode_s >= r->ema_verify_s) r->since_probe = 0;
    else if (++r->since_probe >= EVAL_RECORD_PROBE) r->since_probe = 0; /* probe: acceptance may have risen */
    else skip = 1;
    r->skipped = skip;
    return skip;
}

static int rec_len(void *ctx) {
    eval_recorder *r = ctx;
    return r->inner.context_len(r->inner.ctx);
}

void eval_recorder_adapt(eval_recorder *r, const eval_costs *costs, int B) {
    r->adaptive = 1;
    const double dec = eval_cost_chain(costs, 1), ver = eval_cost_chain(costs, B);
    if (dec > 0 && ver > 0) r->fixed_costs = 1, r->ema_decode_s = dec, r->ema_verify_s = ver;
}

int eval_recorder_init(eval_recorder *r, dfl_draft_if inner, eval_truth *t, eval_draft_cache *cache, int V) {
    memset(r, 0, sizeof *r);
    r->inner = inner, r->truth = t, r->cache = cache, r->V = V;
    for (int i = 0; i < inner.n_feature_layers; i++)
        if ((r->map[i] = eval_truth_column(t, inner.feature_layers[i])) < 0)
            return dfl_seterr("recording: the drafter reads layer %d, which the features do not hold",
                              inner.feature_layers[i]);
    return DFL_OK;
}

void eval_recorder_free(eval_recorder *r) {
    free(r->rows), free(r->feat_in), free(r->lbuf), free(r->top), free(r->toplp);
    memset(r, 0, sizeof *r);
}

dfl_draft_if eval_recorder_if(eval_recorder *r) {
    return (dfl_draft_if){.ctx = r,
                          .add_context = rec_add,
                          .draft = rec_draft,
                          .draft_top = rec_draft_top,
                          .context_len = rec_len,
                          .skip = r->adaptive ? rec_skip : NULL,
                          .feature_layers = r->truth->layers,
                          .n_feature_layers = r->truth->n_layers};
}

/* ---- costs ------------------------------------------------------------------------------ */

double eval_cost_chain(const eval_costs *c, int n) {
    if (!c || !c->ok || c->n_chain == 0) return -1;
    if (n <= c->chain_n[0]) return c->chain_s[0];
    for (int i = 1; i < c->n_chain; i++)
        if (n <= c->chain_n[i]) {
            const double f = (double)(n - c->chain_n[i - 1]) / (c->chain_n[i] - c->chain_n[i - 1]);
            return c->chain_s[i - 1] + f * (c->chain_s[i] - c->chain_s[i - 1]);
        }
    return c->chain_s[c->n_chain - 1];
}

double eval_cost_tree(const eval_costs *c, int budget) {
    if (!c || !c->ok) return -1;
    for (int i = 0; i < c->n_tree; i++)
        if (c->tree_budget[i] == budget) return c->tree_s[i];
    return -1;
}

/* ---- replay ----------------------------------------------------------------------------- */

typedef struct mode_run {
    int budget, n_out, done;
    double build_s, verify_s;
    long draft_rounds;
    int *acc, acc_cap;
    dfl_gen_stats *st;
} mode_run;

/* Keep the accepted drafts of the round round_score has just counted. */
static int push_round(mode_run *m, int a) {
    const int i = m->st->rounds - 1;
    if (i == m->acc_cap) {
        const int cap = m->acc_cap ? 2 * m->acc_cap : 64;
        int *p = realloc(m->acc, (size_t)cap * sizeof *p);
        if (!p) return dfl_seterr("out of memory for round lengths");
        m->acc = p, m->acc_cap = cap;
    }
    m->acc[i] = a;
    return DFL_OK;
}

/* Commit a accepted drafts + the bonus: the output stops where the truth does. */
static void advance(mode_run *m, const eval_truth *t, int a) {
    m->n_out += a + 1;
    if (m->n_out >= t->n) m->n_out = t->n, m->done = 1;
}

/* Replay's target: at each depth of the walk, the truth's token there (ud: the output from the
 * anchor's successor on). */
static int32_t truth_choice(void *ud, int node, int depth, int *final) {
    (void)node, (void) final;
    return ((const int32_t *)ud)[depth];
}

/* One round of mode m at output length n_out: its proposal (the anchor alone for a plain decode
 * step as the online loop's last one, the chain of the draft's argmaxes, or the tree of its
 * budget from the draft's top candidates, K_top kept), walked along the truth and counted. */
static int replay_round(mode_run *m, const eval_truth *t, int n_out, int bs, const eval_draft *dr, int K_top, int V,
                        dfl_tree *tree, const eval_costs *costs) {
    const int32_t anchor = t->ids[n_out - 1];
    int32_t chain[DFL_MAX_BLOCK];
    dfl_proposal p = {.token = &anchor, .n = 1};
    if (bs == 1) {
        m->verify_s += eval_cost_chain(costs, 1);
    } else if (m->budget == 0) {
        chain[0] = anchor;
        memcpy(chain + 1, dr->argmax, (size_t)(bs - 1) * sizeof *chain);
        p = (dfl_proposal){.token = chain, .n = bs, .depth = bs - 1};
        m->verify_s += eval_cost_chain(costs, bs);
    } else {
        const double t0 = dfl_now();
        const int K = m->budget < V ? m->budget : V;
        if (ddtree_build_top(tree, anchor, dr->top, dr->toplp, bs - 1, K_top, K, m->budget)) return DFL_ERR;
        m->build_s += dfl_now() - t0;
        p = (dfl_proposal){.token = tree->token, .parent = tree->parent, .n = tree->n, .depth = tree->max_depth};
        m->verify_s += eval_cost_tree(costs, m->budget);
    }
    if (bs > 1) m->draft_rounds++;
    int path[DFL_MAX_BLOCK];
    int32_t bonus;
    const int a = round_walk(&p, truth_choice, (void *)(t->ids + n_out), path, &bonus); /* read only */
    round_score(m->st, &p, a);
    if (push_round(m, a)) return DFL_ERR;
    advance(m, t, a);
    return DFL_OK;
}

int eval_replay_grow(dfl_draft_if *dr, const eval_truth *t, const int *col, float *rows, int32_t *toks, int chunk,
                     int upto, eval_draft_cache *c) {
    const int nd = dr->n_feature_layers, H = t->H;
    const double t0 = dfl_now();
    int have = dr->context_len(dr->ctx);
    if (c) c->ctx_rows += upto > have ? upto - have : 0;
    while (have < upto) {
        const int p0 = have, n = upto - p0 < chunk ? upto - p0 : chunk;
        for (int p = 0; p < n; p++) {
            for (int i = 0; i < nd; i++)
                memcpy(rows + ((size_t)p * nd + i) * H, t->feat + ((size_t)(p0 + p) * t->n_layers + col[i]) * H,
                       (size_t)H * sizeof(float));
            toks[p] = p0 + p < t->n_prompt ? t->prompt[p0 + p] : t->ids[p0 + p - t->n_prompt];
        }
        const dfl_feat f = dfl_feat_view(rows, n, nd * H);
        if (dr->add_context(dr->ctx, &f, toks, n)) return DFL_ERR;
        have += n;
    }
    if (c) c->ctx_s += dfl_now() - t0;
    return DFL_OK;
}

/* The totals of each mode once its rounds are replayed: the drafter work a mode would do alone,
 * at the rates measured in this run (the context updates of the output's positions, its own
 * drafts and tree builds), and the modeled time where the costs allow. */
static void replay_totals(const eval_truth *t, mode_run *mr, int n_modes, const eval_draft_cache *cache,
                          const eval_costs *costs, eval_replay_out *out) {
    const double per_draft = cache->drafts ? cache->draft_s / cache->drafts : 0;
    const double per_row = cache->ctx_rows ? cache->ctx_s / cache->ctx_rows : 0;
    const int have_costs = costs && costs->ok;
    for (int i = 0; i < n_modes; i++) {
        mode_run *m = &mr[i];
        out[i].st.generated = t->n;
        out[i].round_acc = m->acc;
        m->acc = NULL;
        out[i].draft_s = per_row * (t->n - 1) + per_draft * m->draft_rounds + m->build_s;
        out[i].st.t_draft = out[i].draft_s;
        int measurable = have_costs;
        if (m->budget > 0 && eval_cost_tree(costs, m->budget) < 0) measurable = 0;
        out[i].modeled_s = measurable ? out[i].draft_s + m->verify_s : -1;
        out[i].st.t_verify = measurable ? m->verify_s : 0;
    }
}

/* The checks a job must pass before its replay (B, max_new, budgets as eval_replay_many's). */
static int replay_check(const eval_replay_job *j, int V, int B, int max_new, int max_budget) {
    const eval_truth *t = j->t;
    if (B < 2 || B > DFL_MAX_BLOCK) return dfl_seterr("replay: block size %d outside [2, %d]", B, DFL_MAX_BLOCK);
    if (max_budget > 0 && j->cache->K < (max_budget < V ? max_budget : V))
        return dfl_seterr("replay: the draft cache keeps %d candidates, budget %d needs %d", j->cache->K, max_budget,
                          max_budget < V ? max_budget : V);
    if (j->dft->context_len(j->dft->ctx) != 0) return dfl_seterr("replay: the drafter context is not empty");
    if (t->n > max_new) return dfl_seterr("replay: the truth has %d tokens, more than --max-new %d", t->n, max_new);
    /* rounds read the truth up to --max-new (or a block past its eos): a truth that ends early
     * without an eos does not hold them */
    if (!t->eos_stop && t->n != max_new)
        return dfl_seterr("replay: the truth stops at %d tokens without an eos, but --max-new is %d", t->n, max_new);
    /* the last round may look B-1 tokens past the output (drafts accepted past an eos) */
    const int need = t->eos_stop ? (max_new - t->n < B - 1 ? max_new - t->n : B - 1) : 0;
    if (t->n_ext < need)
        return dfl_seterr("replay: the truth continues %d tokens past its eos, block size %d needs %d", t->n_ext, B,
                          need);
    return DFL_OK;
}

/* What a replay's waves share: the run's sizes, the tree and the scratch. */
typedef struct eval_replay_ctx {
    int V, B, max_new;
    const int *layer_col;
    dfl_tree *tree;
    const eval_costs *costs;
    float *logits; /* [jobs * (B-1), V] */
    float *rows;   /* [B, layers * H] context rows being added */
    int32_t *toks; /* [B] */
    void **ctxs;   /* [jobs] */
    int32_t *anchors;
    int *starts;
} eval_replay_ctx;

/* A block one wave drafts: job j's, at (start, bs). */
typedef struct wave_block {
    int job, start, bs;
    int32_t anchor;
} wave_block;

/* The modes of each job at its shortest output go next (their draft serves them all, and the
 * job's context only grows); the blocks among them that no cache holds, grouped by size (only
 * last rounds are shorter), into wb. Returns their count, -1 once every mode is done. */
static int wave_plan(const eval_replay_job *jobs, int nj, mode_run *const *mr, int n_modes, int B, int max_new,
                     int *next_out, wave_block *wb) {
    int n = 0, live = 0;
    for (int j = 0; j < nj; j++) {
        next_out[j] = -1;
        for (int i = 0; i < n_modes; i++)
            if (!mr[j][i].done && (next_out[j] < 0 || mr[j][i].n_out < next_out[j])) next_out[j] = mr[j][i].n_out;
        if (next_out[j] < 0) continue;
        live = 1;
        const eval_truth *t = jobs[j].t;
        const int n_out = next_out[j], start = t->n_prompt + n_out - 1;
        int bs = max_new - n_out < B ? max_new - n_out : B;
        if (bs < 1) bs = 1;
        if (bs > 1 && !eval_draft_cache_get(jobs[j].cache, start, bs))
            wb[n++] = (wave_block){.job = j, .start = start, .bs = bs, .anchor = t->ids[n_out - 1]};
    }
    for (int a = 1; a < n; a++) /* stable: by size, largest first */
        for (int b = a; b > 0 && wb[b].bs > wb[b - 1].bs; b--) {
            const wave_block x = wb[b];
            wb[b] = wb[b - 1], wb[b - 1] = x;
        }
    return live ? n : -1;
}

/* wave_draft where every cache keeps chains (K 0): each block's argmaxes alone, logits scratch. */
static int wave_draft_ids(const eval_replay_job *jobs, const wave_block *wb, int n, float *logits, void **ctxs,
                          const int32_t *anchors, const int *starts, int across) {
    const int bs = wb[0].bs;
    int32_t *ids = malloc((size_t)n * (bs - 1) * sizeof *ids);
    if (!ids) return dfl_seterr("out of memory for %d drafts", n);
    const double t0 = dfl_now();
    const dfl_draft_if *d0 = jobs[wb[0].job].dft;
    int rc = across ? d0->draft_across_ids(ctxs, anchors, starts, n, bs, ids, logits) : DFL_OK;
    for (int k = 0; !across && k < n && rc == DFL_OK; k++) {
        const dfl_draft_if *d = jobs[wb[k].job].dft;
        rc = d->draft_ids(d->ctx, wb[k].anchor, bs, ids + (size_t)k * (bs - 1), logits);
    }
    const double share = (dfl_now() - t0) / n;
    for (int k = 0; k < n && rc == DFL_OK; k++) {
        eval_draft_cache *c = jobs[wb[k].job].cache;
        c->draft_s += share, c->drafts++;
        rc = eval_draft_cache_put_top(c, wb[k].start, bs, &(dfl_draft_top){.argmax = ids + (size_t)k * (bs - 1)});
    }
    free(ids);
    return rc;
}

/* Draft the n blocks wb (one per job, one size) in one forward where the drafter drafts across
 * contexts, else one by one; each into its job's cache (summarized in place: the logits are not
 * read again), the forward's time shared among them. */
static int wave_draft(const eval_replay_job *jobs, const wave_block *wb, int n, int V, float *logits, void **ctxs,
                      int32_t *anchors, int *starts) {
    const int bs = wb[0].bs;
    dfl_draft_if *d0 = jobs[wb[0].job].dft;
    int across = n > 1 && d0->draft_across;
    for (int k = 0; k < n; k++) {
        const dfl_draft_if *d = jobs[wb[k].job].dft;
        across &= d->draft_across == d0->draft_across;
        ctxs[k] = d->ctx, anchors[k] = wb[k].anchor, starts[k] = wb[k].start;
    }
    int chains = !across || d0->draft_across_ids; /* caches of argmaxes alone: the drafter may find them */
    for (int k = 0; k < n; k++) chains &= jobs[wb[k].job].cache->K == 0 && jobs[wb[k].job].dft->draft_ids;
    if (chains) return wave_draft_ids(jobs, wb, n, logits, ctxs, anchors, starts, across);
    const double t0 = dfl_now();
    if (across && d0->draft_across(ctxs, anchors, starts, n, bs, logits)) return DFL_ERR;
    for (int k = 0; !across && k < n; k++) {
        const dfl_draft_if *d = jobs[wb[k].job].dft;
        if (d->draft(d->ctx, wb[k].anchor, bs, logits + (size_t)k * (bs - 1) * V)) return DFL_ERR;
    }
    const double share = (dfl_now() - t0) / n;
    for (int k = 0; k < n; k++) {
        eval_draft_cache *c = jobs[wb[k].job].cache;
        c->draft_s += share, c->drafts++;
        if (eval_draft_cache_take(c, wb[k].start, bs, logits + (size_t)k * (bs - 1) * V)) return DFL_ERR;
    }
    return DFL_OK;
}

/* One wave: each job's context grown to its block's start, the blocks drafted size by size,
 * then every mode at its job's shortest output plays its round. */
static int wave_run(const eval_replay_job *jobs, int nj, mode_run **mr, int n_modes, const int *next_out,
                    const wave_block *wb, int n, const eval_replay_ctx *x) {
    for (int k = 0; k < n; k++) {
        const eval_replay_job *j = &jobs[wb[k].job];
        if (eval_replay_grow(j->dft, j->t, x->layer_col, x->rows, x->toks, x->B, wb[k].start, j->cache)) return DFL_ERR;
    }
    for (int k0 = 0, k1; k0 < n; k0 = k1) {
        for (k1 = k0 + 1; k1 < n && wb[k1].bs == wb[k0].bs;) k1++;
        if (wave_draft(jobs, wb + k0, k1 - k0, x->V, x->logits, x->ctxs, x->anchors, x->starts)) return DFL_ERR;
    }
    for (int j = 0; j < nj; j++) {
        if (next_out[j] < 0) continue;
        const eval_truth *t = jobs[j].t;
        const int n_out = next_out[j], start = t->n_prompt + n_out - 1;
        int bs = x->max_new - n_out < x->B ? x->max_new - n_out : x->B;
        if (bs < 1) bs = 1;
        const eval_draft *dr = bs > 1 ? eval_draft_cache_get(jobs[j].cache, start, bs) : NULL;
        for (int i = 0; i < n_modes; i++)
            if (!mr[j][i].done && mr[j][i].n_out == n_out &&
                replay_round(&mr[j][i], t, n_out, bs, dr, jobs[j].cache->K, x->V, x->tree, x->costs))
                return DFL_ERR;
    }
    return DFL_OK;
}

/* The mode states of a job's replay, its outputs zeroed. */
static void replay_start(const eval_replay_job *j, mode_run *mr, const int *budgets, int n_modes, int B) {
    for (int i = 0; i < n_modes; i++) {
        memset(&j->out[i], 0, sizeof j->out[i]);
        mr[i].budget = budgets[i];
        mr[i].st = &j->out[i].st;
        mr[i].st->prompt_tokens = j->t->n_prompt;
        mr[i].st->max_block = B;
        mr[i].st->stop = j->t->eos_stop ? "eos" : "max_new";
        mr[i].n_out = 1; /* the first token comes from the prefill */
        mr[i].done = j->t->n <= 1;
    }
}

int eval_replay_many(const eval_replay_job *jobs, int nj, int V, const int *layer_col, int B, int max_new,
                     const int *budgets, int n_modes, const eval_costs *costs) {
    int max_budget = 0;
    for (int i = 0; i < n_modes; i++) max_budget = budgets[i] > max_budget ? budgets[i] : max_budget;
    if (nj < 1) return dfl_seterr("replay: no truths");
    for (int j = 0; j < nj; j++)
        if (replay_check(&jobs[j], V, B, max_new, max_budget)) return DFL_ERR;
    const int nd = jobs[0].dft->n_feature_layers, H = jobs[0].t->H;
    mode_run **mr = calloc((size_t)nj, sizeof *mr);
    int *next_out = malloc((size_t)nj * sizeof *next_out);
    wave_block *wb = malloc((size_t)nj * sizeof *wb);
    dfl_tree tree = {0};
    eval_replay_ctx x = {.V = V, .B = B, .max_new = max_new, .layer_col = layer_col, .tree = &tree, .costs = costs};
    x.logits = dfl_alloc((size_t)nj * (B - 1) * V * sizeof(float));
    x.rows = malloc((size_t)B * nd * H * sizeof(float));
    x.toks = malloc((size_t)B * sizeof(int32_t));
    x.ctxs = malloc((size_t)nj * sizeof *x.ctxs);
    x.anchors = malloc((size_t)nj * sizeof *x.anchors);
    x.starts = malloc((size_t)nj * sizeof *x.starts);
    int rc = DFL_ERR, ok = mr && next_out && wb && x.logits && x.rows && x.toks && x.ctxs && x.anchors && x.starts;
    for (int j = 0; ok && j < nj; j++) ok = (mr[j] = calloc((size_t)n_modes, sizeof *mr[j])) != NULL;
    if (!ok) dfl_seterr("out of memory for a replay of %d truths", nj);
    else if (max_budget == 0 || ddtree_alloc(&tree, max_budget) == DFL_OK) {
        for (int j = 0; j < nj; j++) replay_start(&jobs[j], mr[j], budgets, n_modes, B);
        int n;
        while ((n = wave_plan(jobs, nj, mr, n_modes, B, max_new, next_out, wb)) >= 0)
            if (wave_run(jobs, nj, mr, n_modes, next_out, wb, n, &x)) break;
        if (n < 0) {
            for (int j = 0; j < nj; j++) replay_totals(jobs[j].t, mr[j], n_modes, jobs[j].cache, costs, jobs[j].out);
            rc = DFL_OK;
        }
    }
    for (int j = 0; mr && j < nj; j++)
        for (int i = 0; mr[j] && i < n_modes; i++) free(mr[j][i].acc);
    for (int j = 0; mr && j < nj; j++) free(mr[j]);
    free(mr), free(next_out), free(wb), free(x.logits), free(x.rows), free(x.toks), free(x.ctxs), free(x.anchors);
    free(x.starts);
    ddtree_free(&tree);
    return rc;
}

int eval_replay(const eval_truth *t, dfl_draft_if *dft, int V, const int *layer_col, int B, int max_new,
                const int *budgets, int n_modes, eval_draft_cache *cache, const eval_costs *costs,
                eval_replay_out *out) {
    const eval_replay_job j = {.t = t, .dft = dft, .cache = cache, .out = out};
    return eval_replay_many(&j, 1, V, layer_col, B, max_new, budgets, n_modes, costs);
}

void eval_replay_out_free(eval_replay_out *o) {
    free(o->round_acc);
    o->round_acc = NULL;
}
