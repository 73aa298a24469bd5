/* Generation loop: autoregressive and speculative (chain or DDTree verification) with exact rollback. */
#include "dfl/spec.h"

#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/round.h"

void rng_seed(dfl_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        r->s[i] = z ^ (z >> 31);
    }
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double rng_uniform(dfl_rng *r) { /* xoshiro256** */
    uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * 0x1.0p-53;
}

int spec_is_eos(const dfl_model *m, int32_t id) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] == id) return 1;
    return 0;
}

double spec_tau(const dfl_gen_stats *st) {
    /* the first token comes from the prefill, every other one from a round */
    return st->rounds ? (double)(st->generated - 1) / st->rounds : 0.0;
}

double spec_tau_accept(const dfl_gen_stats *st) {
    return st->rounds ? (double)(st->accepted + st->rounds) / st->rounds : 0.0;
}

/* probs = softmax(logits / T) */
static void softmax_t(float *probs, const float *logits, int V, float T) {
    for (int i = 0; i < V; i++) probs[i] = logits[i] / T;
    kn_softmax(probs, V);
}

static int32_t sample(const float *p, int V, dfl_rng *r) {
    double u = rng_uniform(r), acc = 0, total = 0;
    for (int i = 0; i < V; i++) total += p[i];
    u *= total;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        acc += p[i];
        last = i;
        if (u < acc) return i;
    }
    return last;
}

/* ranked: higher p first, ties by the lower id (a deterministic order for the filter) */
static int ranked_before(const dfl_ranked *a, const dfl_ranked *b) {
    return a->p > b->p || (a->p == b->p && a->id < b->id);
}

static int ranked_cmp(const void *x, const void *y) {
    const dfl_ranked *a = x, *b = y;
    return ranked_before(a, b) ? -1 : ranked_before(b, a) ? 1 : 0;
}

/* min-heap on the ranking: h[0] is the least of the kept candidates */
static void heap_down(dfl_ranked *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranked_before(&h[m], &h[l])) m = l;
        if (r < n && ranked_before(&h[m], &h[r])) m = r;
        if (m == i) return;
        const dfl_ranked t = h[i];
        h[i] = h[m], h[m] = t, i = m;
    }
}

int spec_sampling_filter(float *p, int V, int top_k, float top_p, dfl_ranked *c) {
    const int use_k = top_k > 0 && top_k<V, use_p = top_p> 0 && top_p < 1;
    if (!use_k && !use_p) return V;
    int n = 0;
    double mass = 0; /* what top-p is a fraction of: the top-k survivors' mass, or all of it */
    if (use_k) {     /* the top_k best in one pass over the vocabulary: a min-heap of k */
        for (int i = 0; i < V; i++) {
            const dfl_ranked x = {p[i], i};
            if (n < top_k) {
                c[n++] = x;
                if (n == top_k)
                    for (int j = n / 2 - 1; j >= 0; j--) heap_down(c, n, j);
            } else if (ranked_before(&x, &c[0])) {
                c[0] = x;
                heap_down(c, n, 0);
            }
        }
        for (int i = 0; i < n; i++) mass += c[i].p;
    } else {
        /* top-p alone: a token whose p is at most (1 - top_p) * total / V has at least top_p of
         * the mass ranked before it (the rest, itself included, holds at most V times its p), so
         * it is dropped; half that bound leaves room for rounding. Only the others are sorted. */
        for (int i = 0; i < V; i++) mass += p[i];
        const double floor_p = 0.5 * (1.0 - top_p) * mass / V;
        for (int i = 0; i < V; i++)
            if (p[i] > floor_p) c[n++] = (dfl_ranked){p[i], i};
        if (n == 0) return V; /* no mass anywhere: nothing to filter */
    }
    qsort(c, (size_t)n, sizeof *c, ranked_cmp);
    int keep = n;
    if (use_p) { /* the smallest most-probable-first prefix whose mass reaches top_p */
        double cum = 0;
        keep = 0;
        while (keep < n && (keep == 0 || cum < (double)top_p * mass)) cum += c[keep++].p;
    }
    double kept = 0;
    for (int i = 0; i < keep; i++) kept += c[i].p;
    memset(p, 0, (size_t)V * sizeof *p);
    if (!(kept > 0)) { /* no mass among the kept (a q that is zero there): the best one alone */
        p[c[0].id] = 1.0f;
        return 1;
    }
    for (int i = 0; i < keep; i++) p[c[i].id] = (float)(c[i].p / kept);
    return keep;
}

/* The sampling distribution at temperature > 0: softmax(logits / T), top-k / top-p filtered.
 * In place when probs == logits. */
static void sampling_probs(float *probs, const float *logits, int V, const dfl_gen_opts *o, dfl_ranked *scratch) {
    softmax_t(probs, logits, V, o->temperature);
    spec_sampling_filter(probs, V, o->top_k, o->top_p, scratch);
}

static int32_t pick(const float *logits, int V, const dfl_gen_opts *o, float *probs, dfl_ranked *scratch, dfl_rng *r) {
    if (o->temperature <= 0) return kn_argmax(logits, V);
    sampling_probs(probs, logits, V, o, scratch);
    return sample(probs, V, r);
}

static int dflash_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    (void)tokens; /* DFlash reads features only */
    return drafter_add_features(ctx, feat, n);
}
static int dflash_draft(void *ctx, int32_t anchor, int B, float *logits) {
    return drafter_draft(ctx, anchor, B, logits);
}
static int dflash_draft_ids(void *ctx, int32_t anchor, int B, int32_t *ids, float *scratch) {
    return drafter_draft_ids(ctx, anchor, B, ids, scratch);
}
static int dflash_draft_many(void *ctx, const int32_t *anchors, const int *starts, int n, int B, float *logits) {
    return drafter_draft_many(ctx, anchors, starts, n, B, logits);
}
static int dflash_draft_across(void *const *ctxs, const int32_t *anchors, const int *starts, int n, int B,
                               float *logits) {
    return drafter_draft_across((dfl_drafter_state *const *)ctxs, anchors, starts, n, B, logits);
}
static int dflash_draft_across_ids(void *const *ctxs, const int32_t *anchors, const int *starts, int n, int B,
                                   int32_t *ids, float *scratch) {
    return drafter_draft_across_ids((dfl_drafter_state *const *)ctxs, anchors, starts, n, B, ids, scratch);
}
static int dflash_len(void *ctx) { return ((dfl_drafter_state *)ctx)->n_ctx; }
static void dflash_reset(void *ctx) { drafter_state_reset(ctx); }

dfl_draft_if spec_dflash_drafter(dfl_drafter_state *ds) {
    return (dfl_draft_if){.ctx = ds,
                          .add_context = dflash_add,
                          .draft = dflash_draft,
                          .draft_ids = dflash_draft_ids,
                          .context_len = dflash_len,
                          .draft_many = ds->d->cfg.dflash2 ? NULL : dflash_draft_many,
                          .draft_across = ds->d->cfg.dflash2 ? NULL : dflash_draft_across,
                          .draft_across_ids = ds->d->cfg.dflash2 ? NULL : dflash_draft_across_ids,
                          .reset = dflash_reset,
                          .feature_layers = ds->d->cfg.target_layer_ids,
                          .n_feature_layers = ds->d->cfg.n_target_ids};
}

/* One generation: its settings, buffers and output so far. */
typedef struct gen {
    dfl_target_state *s;
    dfl_draft_if *dr; /* NULL: autoregressive */
    const dfl_model *m;
    const dfl_gen_opts *o;
    dfl_gen_stats *st;
    int V, H, B, N;   /* vocabulary, hidden size, block size, tree budget (0: chain) */
    int ids_only;     /* greedy without on_logits: each row's argmax is all the loop reads */
    int pq;           /* sampled drafts accepted with min(1, p/q) (DFL_ACCEPT_PQ at temperature > 0) */
    float *logits;    /* a verification's rows */
    int top_k;        /* opts.on_top: candidates a row, else 0 */
    int32_t *topi;    /* [rows, top_k] each row's most probable tokens (opts.on_top) */
    float *toplp;     /* [rows, top_k] their log-probabilities */
    float *probs;     /* [V] the target's sampling distribution */
    dfl_ranked *rank; /* [V] the sampling filter's scratch (temperature > 0) */
    float *dlogits;   /* [B - 1, V] the drafter's output (with pq: its filtered probabilities) */
    int K;            /* candidates a draft row gives a tree: min(N, V) */
    dfl_draft_top dt; /* the draft as chain and tree read it: argmax [B], top / toplp [B - 1][K] */
    dfl_feat feat;    /* the captured features of the rows of a forward, where the target runs */
    float *plog;      /* the prompt's rows for opts.prompt_logits, else NULL */
    dfl_tree tree;
    dfl_rng rng;
    dfl_capture cap;
    int32_t *out;
    int n_out, stopped;
    int n_past_eos; /* tokens of the stopping round committed past an eos, kept at out[n_out..] */
    dfl_token_cb cb;
    void *ud;
} gen;

/* A verification forward. Greedy without a logits callback (ids_only), the loop reads only each
 * row's argmax: the logits buffer is then scratch, and a device backend sends back the ids
 * alone. The ids are kn_argmax of the same rows either way. */
static int verify_forward(const gen *g, const int32_t *toks, const int *parent, int n, int last_only, int32_t *ids,
                          const dfl_capture *cap) {
    const dfl_fwd_out fo = {.logits = g->logits,
                            .argmax = g->ids_only ? ids : NULL,
                            .last_only = last_only,
                            .logits_scratch = g->ids_only,
                            .cap = cap,
                            .top_k = g->top_k,
                            .top_ids = g->topi,
                            .top_lp = g->toplp};
    return model_forward_ex(g->s, toks, parent, n, &fo);
}

/* Append committed tokens, stopping after an eos or at max_new; calls the stream callback.
 * rows[k]: the row of the last forward (g->logits, g->topi) behind toks[k]. */
static void commit(gen *g, const int32_t *toks, int n, const int *rows) {
    int k = 0;
    while (k < n && !g->stopped) {
        const dfl_gen_opts *o = g->o;
        if (o->on_logits) o->on_logits(o->on_logits_ud, 0, g->n_out, toks[k], g->logits + (size_t)rows[k] * g->V, g->V);
        if (g->top_k)
            o->on_top(o->on_top_ud, g->n_out, toks[k], g->topi + (size_t)rows[k] * g->top_k,
                      g->toplp + (size_t)rows[k] * g->top_k);
        g->out[g->n_out++] = toks[k++];
        if (!g->o->ignore_eos && spec_is_eos(g->m, toks[k - 1])) {
            g->stopped = 1;
            g->st->stop = "eos";
            /* the rest of the round is the greedy continuation past the eos (opts.extend) */
            for (int j = k; j < n && g->n_out + g->n_past_eos < g->o->max_new; j++)
                g->out[g->n_out + g->n_past_eos++] = toks[j];
        } else if (g->n_out >= g->o->max_new) {
            g->stopped = 1;
        }
    }
    if (g->cb && k && g->cb(g->ud, toks, k)) g->stopped = 1;
}

/* opts.extend: the greedy continuation past an eos. The state holds every position of the raw
 * output (the output and the tokens of its last round past the eos) but the last token. */
static int extend_past_eos(gen *g) {
    const int want = g->o->extend < g->o->max_new - g->n_out ? g->o->extend : g->o->max_new - g->n_out;
    int have = g->n_past_eos;
    while (have < want) {
        const int32_t last = g->out[g->n_out + have - 1];
        int32_t id;
        const dfl_fwd_out fo = {.logits = g->logits, .argmax = &id, .last_only = 1, .logits_scratch = 1};
        if (model_forward_ex(g->s, &last, NULL, 1, &fo)) return DFL_ERR;
        g->out[g->n_out + have++] = id;
    }
    g->st->extended = want > 0 ? want : 0;
    return DFL_OK;
}

/* What a round's walk asks the target at each node: the node's verified row (its argmax from
 * ids when given, else from the logits, or its sample). */
typedef struct verdict {
    gen *g;
    const dfl_proposal *p;
    const int32_t *ids; /* each row's argmax (ids_only), else NULL */
} verdict;

static int32_t target_choice(void *ud, int node, int depth, int *final) {
    (void)depth; /* the verified rows are the proposal's nodes */
    const verdict *v = ud;
    gen *g = v->g;
    const int V = g->V;
    const float *row = g->logits + (size_t)node * V;
    if (v->ids) return v->ids[node];
    if (g->o->temperature <= 0) return kn_argmax(row, V);
    float *p = g->probs;
    sampling_probs(p, row, V, g->o, g->rank);
    if (g->pq && node + 1 < v->p->n) { /* a chain's draft after node, accepted with min(1, p/q) */
        const float *q = g->dlogits + (size_t)node * V;
        const int32_t d = v->p->token[node + 1];
        if (rng_uniform(&g->rng) * q[d] < p[d]) return d;
        double left = 0;
        for (int i = 0; i < V; i++) left += p[i] > q[i] ? p[i] - q[i] : 0.0f;
        /* a rejection needs p(d) < q(d), so p - q has positive mass elsewhere; where
         * rounding leaves none (p and q equal to float precision), sample p itself
         * rather than an all-zero vector (token 0) */
        if (left > 0)
            for (int i = 0; i < V; i++) p[i] = p[i] > q[i] ? p[i] - q[i] : 0.0f;
        *final = 1; /* the sample from norm(max(0, p - q)) ends the round, even if it is d */
    }
    return sample(p, V, &g->rng);
}

/* The accepted path's features, in path order, extend the drafter's context. */
static int extend_context(gen *g, const dfl_proposal *p, const int *path, int len) {
    const double td = dfl_now();
    int32_t tok[DFL_MAX_BLOCK];
    for (int k = 0; k < len; k++) tok[k] = p->token[path[k]];
    if (dfl_feat_gather(&g->feat, path, len) || g->dr->add_context(g->dr->ctx, &g->feat, tok, len)) return DFL_ERR;
    g->st->t_draft += dfl_now() - td;
    return DFL_OK;
}

/* After a round's forward (begun at tv): walk p along the target's choices, keep the accepted
 * path in the state (exact rollback of the rest) and in the drafter's context, count the round,
 * commit the accepted drafts and the bonus token (stopping at an eos or max_new). */
static int accept(gen *g, const dfl_proposal *p, const int32_t *ids, int start, double tv) {
    dfl_gen_stats *st = g->st;
    const int V = g->V;
    verdict v = {.g = g, .p = p, .ids = g->ids_only ? ids : NULL};
    int path[DFL_MAX_BLOCK];
    int32_t bonus;
    const int a = round_walk(p, target_choice, &v, path, &bonus);
    st->t_verify += dfl_now() - tv;
    if (p->n > 1) { /* a plain decode step ran without a rollback record: nothing to undo */
        const double tr = dfl_now();
        if (p->parent ? target_state_tree_commit(g->s, path, a + 1) : target_state_rollback(g->s, start + a + 1))
            return DFL_ERR;
        st->t_rollback += dfl_now() - tr;
    }
    if (g->dr && extend_context(g, p, path, a + 1)) return DFL_ERR;
    round_score(st, p, a);
    const float *draft = p->n > 1 && !p->parent && !g->o->on_round_no_draft ? g->dlogits : NULL; /* a chain's */
    if (g->o->on_round) g->o->on_round(g->o->on_round_ud, start, p->token, p->n, draft, V, a);
    int32_t acc[DFL_MAX_BLOCK];
    for (int k = 0; k < a; k++) acc[k] = p->token[path[k + 1]];
    acc[a] = bonus;
    commit(g, acc, a + 1, path); /* token k was chosen by the row of path[k] */
    return DFL_OK;
}

/* A plain decode step: the last step of a speculative run, one the drafter skips, every step of
 * an autoregressive run. */
static int decode_step(gen *g, int32_t anchor, int start) {
    const double tv = dfl_now();
    int32_t id;
    if (verify_forward(g, &anchor, NULL, 1, 1, &id, g->dr ? &g->cap : NULL)) return DFL_ERR;
    const dfl_proposal p = {.token = &anchor, .n = 1};
    return accept(g, &p, &id, start, tv);
}

/* A chain round: the block of the anchor and bs-1 drafts (argmax, or with pq sampled from the
 * filtered q), verified in one forward on top of the cache. */
static int chain_round(gen *g, int32_t anchor, int start, int bs) {
    const int V = g->V;
    const double td = dfl_now();
    int32_t block[DFL_MAX_BLOCK];
    block[0] = anchor;
    for (int k = 1; k < bs; k++) {
        float *q = g->dlogits + (size_t)(k - 1) * V;
        if (g->pq) {
            sampling_probs(q, q, V, g->o, g->rank); /* keep q_k (filtered as p is) for the acceptance test */
            block[k] = sample(q, V, &g->rng);
        } else {
            block[k] = g->dt.argmax[k - 1];
        }
    }
    g->st->t_draft += dfl_now() - td;
    const double tv = dfl_now();
    int32_t ids[DFL_MAX_BLOCK];
    g->s->no_record = 0; /* the rejected drafts' positions are rolled back */
    const int fw = verify_forward(g, block, NULL, bs, 0, ids, &g->cap);
    g->s->no_record = 1;
    if (fw) return DFL_ERR;
    const dfl_proposal p = {.token = block, .n = bs, .depth = bs - 1};
    return accept(g, &p, ids, start, tv);
}

/* A DDTree round: the tree of the N most probable prefixes from the drafter's bs-1
 * distributions, verified in one forward. */
static int tree_round(gen *g, int32_t anchor, int start, int bs) {
    const double td = dfl_now();
    if (ddtree_build_top(&g->tree, anchor, g->dt.top, g->dt.toplp, bs - 1, g->K, g->K, g->N)) return DFL_ERR;
    g->st->t_draft += dfl_now() - td;
    const double tv = dfl_now();
    const dfl_tree *t = &g->tree;
    int32_t ids[DFL_MAX_BLOCK + 1];
    if (verify_forward(g, t->token, t->parent, t->n, 0, ids, &g->cap)) return DFL_ERR;
    const dfl_proposal p = {.token = t->token, .parent = t->parent, .n = t->n, .depth = t->max_depth};
    return accept(g, &p, ids, start, tv);
}

/* A speculative round: the draft of bs-1 tokens after the anchor, then its verification. */
static int spec_round(gen *g, int32_t anchor, int start, int bs) {
    dfl_draft_if *dr = g->dr;
    const double td = dfl_now();
    if (dr->context_len(dr->ctx) != start) { /* the drafter's context must end right before the anchor */
        g->st->ctx_check_failures++;
        return dfl_seterr("drafter context holds %d positions but %d are committed (the anchor must not be in it)",
                          dr->context_len(dr->ctx), start);
    }
    /* a sampled chain needs q itself; otherwise the draft's summary: the argmaxes of a chain (and
     * its logits for on_round), a tree's top candidates */
    int rc;
    if (g->pq) rc = dr->draft(dr->ctx, anchor, bs, g->dlogits);
    else
        rc = dfl_draft_topk(dr, anchor, bs, g->V, &g->dt, g->dlogits,
                            g->N == 0 && g->o->on_round && !g->o->on_round_no_draft, g->dlogits);
    if (rc) return DFL_ERR;
    g->st->t_draft += dfl_now() - td;
    return g->N > 0 ? tree_round(g, anchor, start, bs) : chain_round(g, anchor, start, bs);
}

/* The prefill, capturing the prompt's features for the drafter, then the first token from its
 * last row. Only block verifications are ever rolled back, so the prefill and plain decode steps
 * skip the rollback record. */
static int prefill(gen *g, const int32_t *prompt, int n_prompt, int32_t *first) {
    dfl_target_state *s = g->s;
    const dfl_gen_opts *o = g->o;
    const int V = g->V, chunk = s->max_batch;
    const dfl_capture *cap = g->dr ? &g->cap : NULL;
    s->no_record = 1;
    const double t0 = dfl_now();
    for (int c0 = 0; c0 < n_prompt; c0 += chunk) {
        const int n = n_prompt - c0 < chunk ? n_prompt - c0 : chunk;
        const int last = c0 + n == n_prompt;
        if (g->plog) { /* every prompt row's logits, for opts.prompt_logits */
            if (model_forward(s, prompt + c0, n, g->plog, 0, cap)) return DFL_ERR;
            for (int r = 0; r < n && c0 + r + 1 < n_prompt; r++)
                o->on_logits(o->on_logits_ud, 1, c0 + r + 1, prompt[c0 + r + 1], g->plog + (size_t)r * V, V);
            if (last) memcpy(g->logits, g->plog + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
        } else {
            const dfl_fwd_out fo = {.logits = last ? g->logits : NULL,
                                    .last_only = 1,
                                    .cap = cap,
                                    .top_k = last ? g->top_k : 0,
                                    .top_ids = g->topi,
                                    .top_lp = g->toplp};
            if (model_forward_ex(s, prompt + c0, NULL, n, &fo)) return DFL_ERR;
        }
        if (g->dr && g->dr->add_context(g->dr->ctx, &g->feat, prompt + c0, n)) return DFL_ERR;
    }
    g->st->t_prefill = dfl_now() - t0;
    if (o->max_new == 0) return DFL_OK; /* the prefill only */
    *first = pick(g->logits, V, o, g->probs, g->rank, &g->rng);
    g->st->t_prefill = dfl_now() - t0;
    return DFL_OK;
}

/* Rounds from the first token until a stop, then opts.extend's continuation past an eos. */
static int decode(gen *g, int32_t first) {
    const dfl_gen_opts *o = g->o;
    const double t0 = dfl_now();
    const int row0 = 0;
    commit(g, &first, 1, &row0);
    while (!g->stopped) {
        const int32_t anchor = g->out[g->n_out - 1];
        const int start = g->s->n_past;
        int bs = o->max_new - g->n_out < g->B ? o->max_new - g->n_out : g->B; /* tokens this round can add */
        if (bs < 1) bs = 1;
        if (bs > 1 && g->dr->skip && g->dr->skip(g->dr->ctx)) bs = 1;
        if (bs == 1 ? decode_step(g, anchor, start) : spec_round(g, anchor, start, bs)) return DFL_ERR;
    }
    g->st->t_decode = dfl_now() - t0;
    g->st->generated = g->n_out;
    if (o->extend > 0 && o->temperature <= 0 && strcmp(g->st->stop, "eos") == 0) return extend_past_eos(g);
    return DFL_OK;
}

/* The settings against the run state and the drafter. */
static int check_opts(const dfl_target_state *s, dfl_draft_if *dr, int n_prompt, const dfl_gen_opts *o) {
    const int B = dr ? o->block : 1, N = dr ? o->tree_budget : 0;
    if (o->max_new < 0) return dfl_seterr("max_new must be >= 0");
    /* a round verifies at most the tokens max_new leaves: a short run needs no batch of a full block */
    if (dr && (B < 2 || B > DFL_MAX_BLOCK || (B < o->max_new ? B : o->max_new) > s->max_batch))
        return dfl_seterr("block size %d: must be in [2, %d] and fit the run state (%d)", B, DFL_MAX_BLOCK,
                          s->max_batch);
    if (dr && !s->record) return dfl_seterr("speculative decoding needs a run state with rollback records");
    if (N < 0 || N > DDTREE_MAX_BUDGET) return dfl_seterr("tree budget %d: must be in [0, %d]", N, DDTREE_MAX_BUDGET);
    if (N > 0 && o->temperature > 0)
        return dfl_seterr("tree verification (DDTree) is greedy: use temperature 0 or chain verification");
    if (!(o->top_p >= 0 && o->top_p <= 1)) return dfl_seterr("top_p must be in (0, 1] (0 = off), found %g", o->top_p);
    if (o->top_k < 0) return dfl_seterr("top_k must be >= 0 (0 = off), found %d", o->top_k);
    if (o->on_top && (o->temperature > 0 || o->on_logits || o->on_top_k < 1 || o->on_top_k > s->m->cfg.vocab))
        return dfl_seterr("on_top: greedy, without on_logits, with 1..%d candidates a row (found %d)", s->m->cfg.vocab,
                          o->on_top_k);
    if (N > 0 && s->tree_cap < N + 1)
        return dfl_seterr("tree budget %d needs a run state with tree verification for %d nodes (has %d)", N, N + 1,
                          s->tree_cap);
    if (n_prompt < 1) return dfl_seterr("empty prompt");
    if (n_prompt + o->max_new + N > s->max_ctx) /* a tree's nodes use slots past start */
        return dfl_seterr("prompt (%d tokens) + max_new %d%s exceed the context of %d", n_prompt, o->max_new,
                          N ? " + tree budget" : "", s->max_ctx);
    if (dr && dr->context_len(dr->ctx) != 0) return dfl_seterr("drafter context is not empty");
    return DFL_OK;
}

/* The buffers and the tree of a run; gen_free frees whatever it got. */
static int gen_alloc(gen *g, int n_prompt) {
    const int V = g->V, B = g->B, N = g->N, chunk = g->s->max_batch;
    const int rows = chunk > B ? (chunk > N + 1 ? chunk : N + 1) : (B > N + 1 ? B : N + 1);
    const int want_plog = g->o->on_logits && g->o->prompt_logits;
    g->logits = dfl_alloc((size_t)(B > N + 1 ? B : N + 1) * V * sizeof(float));
    if (g->top_k) { /* a forward's rows: a block or a tree */
        g->topi = malloc((size_t)(B > N + 1 ? B : N + 1) * g->top_k * sizeof *g->topi);
        g->toplp = malloc((size_t)(B > N + 1 ? B : N + 1) * g->top_k * sizeof *g->toplp);
        if (!g->topi || !g->toplp) return dfl_seterr("out of memory for the rows' top tokens");
    }
    g->probs = malloc((size_t)V * sizeof(float));
    if (g->o->temperature > 0) g->rank = malloc((size_t)V * sizeof *g->rank);
    if (g->dr) {
        g->dlogits = dfl_alloc((size_t)B * V * sizeof(float));
        g->K = N < V ? N : V;
        g->dt = (dfl_draft_top){.K = N > 0 ? g->K : 0, .argmax = malloc((size_t)B * sizeof(int32_t))};
        if (N > 0) g->dt.top = malloc((size_t)B * g->K * sizeof(int32_t));
        if (N > 0) g->dt.toplp = malloc((size_t)B * g->K * sizeof(double));
        if (!g->dt.argmax || (N > 0 && (!g->dt.top || !g->dt.toplp))) return dfl_seterr("out of memory for drafts");
    }
    if (want_plog) g->plog = dfl_alloc((size_t)(n_prompt < chunk ? n_prompt : chunk) * V * sizeof(float));
    if (g->dr && dfl_feat_alloc(&g->feat, g->m->device, rows, g->cap.n_layers * g->H)) return DFL_ERR;
    if (!g->logits || !g->probs || (g->o->temperature > 0 && !g->rank) || (g->dr && !g->dlogits) ||
        (want_plog && !g->plog))
        return dfl_seterr("out of memory for generation buffers");
    return N > 0 ? ddtree_alloc(&g->tree, N) : DFL_OK;
}

static void gen_free(gen *g) {
    ddtree_free(&g->tree);
    free(g->logits), free(g->probs), free(g->rank), free(g->dlogits), free(g->plog);
    dfl_feat_free(&g->feat);
    free(g->dt.argmax), free(g->dt.top), free(g->dt.toplp), free(g->topi), free(g->toplp);
}

const char *spec_accept_rule_name(dfl_accept_rule r) { return r == DFL_ACCEPT_MATCH ? "match" : "pq"; }

int spec_accept_rule_parse(const char *s) {
    if (strcmp(s, "pq") == 0) return DFL_ACCEPT_PQ;
    if (strcmp(s, "match") == 0) return DFL_ACCEPT_MATCH;
    return -1;
}

int spec_generate(dfl_target_state *s, dfl_draft_if *dr, const int32_t *prompt, int n_prompt, const dfl_gen_opts *o,
                  int32_t *out, dfl_gen_stats *st, dfl_token_cb cb, void *ud) {
    memset(st, 0, sizeof *st);
    st->prompt_tokens = n_prompt;
    st->max_block = dr ? o->block : 1;
    st->stop = "max_new";
    st->accept_rule = o->temperature > 0 ? spec_accept_rule_name(o->accept_rule) : "greedy";
    if (check_opts(s, dr, n_prompt, o)) return DFL_ERR;
    gen g = {.s = s,
             .dr = dr,
             .m = s->m,
             .o = o,
             .st = st,
             .V = s->m->cfg.vocab,
             .H = s->m->cfg.hidden,
             .B = st->max_block,
             .N = dr ? o->tree_budget : 0,
             .out = out,
             .cb = cb,
             .ud = ud,
             .ids_only = o->temperature <= 0 && !o->on_logits,
             .top_k = o->on_top ? o->on_top_k : 0,
             .pq = o->temperature > 0 && o->accept_rule == DFL_ACCEPT_PQ,
             .cap = {.n_layers = dr ? dr->n_feature_layers : 0, .layers = dr ? dr->feature_layers : NULL}};
    rng_seed(&g.rng, o->seed);
    const int no_record0 = s->no_record;
    int rc = gen_alloc(&g, n_prompt);
    g.cap.to = &g.feat; /* the forwards capture the drafter's feature layers there */
    int32_t first = 0;
    if (rc == DFL_OK) rc = prefill(&g, prompt, n_prompt, &first);
    if (rc == DFL_OK && o->max_new > 0) rc = decode(&g, first);
    s->no_record = no_record0;
    gen_free(&g);
    return rc;
}
