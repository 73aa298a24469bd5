/* Generation loop: autoregressive and speculative (chain) with exact rollback. */
#include "dfl/spec.h"

#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"

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
    const int use_k = top_k > 0 && top_k < V, use_p = top_p > 0 && top_p < 1;
    if (!use_k && !use_p) return V;
    int n = 0;
    double mass = 0; /* what top-p is a fraction of: the top-k survivors' mass, or all of it */
    if (use_k) { /* the top_k best in one pass over the vocabulary: a min-heap of k */
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

static int32_t pick(const float *logits, int V, const dfl_gen_opts *o, float *probs, dfl_ranked *scratch,
                    dfl_rng *r) {
    if (o->temperature <= 0) return kn_argmax(logits, V);
    sampling_probs(probs, logits, V, o, scratch);
    return sample(probs, V, r);
}

/* A verification forward. Greedy without a logits callback (ids_only), the loop reads only each
 * row's argmax: the logits buffer is then scratch, and a device backend sends back the ids
 * alone. The ids are kn_argmax of the same rows either way. */
static int verify_forward(dfl_state *s, const int32_t *toks, const int *parent, int n, int last_only, float *logits,
                          int32_t *ids, int ids_only, const dfl_capture *cap) {
    const dfl_fwd_out fo = {.logits = logits, .argmax = ids_only ? ids : NULL, .last_only = last_only,
                            .logits_scratch = ids_only, .cap = cap};
    return model_forward_ex(s, toks, parent, n, &fo);
}

static int dflash_add(void *ctx, const float *feat, const int32_t *tokens, int n) {
    (void)tokens; /* DFlash reads features only */
    return drafter_add_context(ctx, feat, n);
}
static int dflash_draft(void *ctx, int32_t anchor, int B, float *logits) { return drafter_draft(ctx, anchor, B, logits); }
static int dflash_draft_many(void *ctx, const int32_t *anchors, const int *starts, int n, int B, float *logits) {
    return drafter_draft_many(ctx, anchors, starts, n, B, logits);
}
static int dflash_len(void *ctx) { return ((dfl_dstate *)ctx)->n_ctx; }
static void dflash_reset(void *ctx) { dstate_reset(ctx); }

dfl_draft_if spec_dflash_drafter(dfl_dstate *ds) {
    return (dfl_draft_if){.ctx = ds, .add_context = dflash_add, .draft = dflash_draft, .context_len = dflash_len,
                          .draft_many = ds->d->cfg.dflash2 ? NULL : dflash_draft_many, .reset = dflash_reset, .feature_layers = ds->d->cfg.target_layer_ids, .n_feature_layers = ds->d->cfg.n_target_ids};
}

typedef struct gen {
    const dfl_model *m;
    const dfl_gen_opts *o;
    dfl_gen_stats *st;
    int32_t *out;
    int n_out, stopped;
    int n_past_eos;   /* tokens of the stopping round committed past an eos, kept at out[n_out..] */
    dfl_token_cb cb;
    void *ud;
} gen;

/* Append committed tokens, stopping after an eos or at max_new; calls the stream callback.
 * rows[k]: the target's logits row behind toks[k] (for opts.on_logits; NULL when unset). */
static void commit(gen *g, const int32_t *toks, int n, const float *const *rows) {
    int k = 0;
    while (k < n && !g->stopped) {
        if (g->o->on_logits && rows) g->o->on_logits(g->o->on_logits_ud, 0, g->n_out, toks[k], rows[k], g->m->cfg.vocab);
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
static int extend_past_eos(dfl_state *s, gen *g, float *logits) {
    const int want = g->o->extend < g->o->max_new - g->n_out ? g->o->extend : g->o->max_new - g->n_out;
    int have = g->n_past_eos;
    while (have < want) {
        const int32_t last = g->out[g->n_out + have - 1];
        int32_t id;
        if (verify_forward(s, &last, NULL, 1, 1, logits, &id, 1, NULL)) return DFL_ERR;
        g->out[g->n_out + have++] = id;
    }
    g->st->extended = want > 0 ? want : 0;
    return DFL_OK;
}

/* One DDTree round: build the tree of the N most probable prefixes from the drafter's bs-1
 * distributions, verify it in one forward, walk it along the target's argmax, commit the
 * accepted path and the bonus token. */
static int tree_round(dfl_state *s, dfl_draft_if *dr, dfl_tree *tree, int N, int32_t anchor, int start, int bs,
                      float *dlogits, float *logits, float *feat, const dfl_capture *cap, dfl_gen_stats *st,
                      const dfl_gen_opts *o, gen *g) {
    const int V = s->m->cfg.vocab, H = s->m->cfg.hidden, nf = dr->n_feature_layers;
    double td = dfl_now();
    for (int k = 0; k < bs - 1; k++) kn_softmax(dlogits + (size_t)k * V, V);
    if (ddtree_build(tree, anchor, dlogits, bs - 1, V, N)) return DFL_ERR;
    st->t_draft += dfl_now() - td;
    double tv = dfl_now();
    int32_t ids[DFL_MAX_BLOCK + 1];
    const int ids_only = !o->on_logits; /* trees are greedy */
    if (verify_forward(s, tree->token, tree->parent, tree->n, 0, logits, ids, ids_only, cap)) return DFL_ERR;
    int path[DFL_MAX_BLOCK], len = 1, cur = 0;
    path[0] = 0;
    int32_t bonus;
    for (;;) {
        bonus = ids_only ? ids[cur] : kn_argmax(logits + (size_t)cur * V, V);
        int next = -1;
        for (int i = cur + 1; i < tree->n && next < 0; i++)
            if (tree->parent[i] == cur && tree->token[i] == bonus) next = i;
        if (next < 0) break;
        path[len++] = cur = next;
    }
    st->t_verify += dfl_now() - tv;
    double tr = dfl_now();
    if (state_tree_commit(s, path, len)) return DFL_ERR;
    st->t_rollback += dfl_now() - tr;
    /* the accepted path's features, in path order, extend the drafter's context */
    td = dfl_now();
    for (int k = 0; k < len; k++)
        if (path[k] != k)
            memcpy(feat + (size_t)k * nf * H, feat + (size_t)path[k] * nf * H, (size_t)nf * H * sizeof(float));
    int32_t path_tok[DFL_MAX_BLOCK];
    for (int k = 0; k < len; k++) path_tok[k] = tree->token[path[k]];
    if (dr->add_context(dr->ctx, feat, path_tok, len)) return DFL_ERR;
    st->t_draft += dfl_now() - td;
    const int a = len - 1;
    st->rounds++;
    st->drafted += tree->n - 1;
    st->tree_nodes += tree->n - 1;
    st->tree_depth_sum += tree->max_depth;
    st->accepted += a;
    st->accept_hist[a]++;
    for (int k = 1; k <= tree->max_depth; k++) {
        st->pos_drafted[k]++;
        if (k <= a) st->pos_accepted[k]++;
    }
    if (o->on_round) o->on_round(o->on_round_ud, start, tree->token, tree->n, NULL, V, a);
    int32_t acc[DFL_MAX_BLOCK];
    for (int k = 1; k < len; k++) acc[k - 1] = tree->token[path[k]];
    acc[a] = bonus;
    const float *rows[DFL_MAX_BLOCK];
    for (int k = 0; k <= a; k++) rows[k] = logits + (size_t)path[k] * V;
    commit(g, acc, a + 1, rows);
    return DFL_OK;
}

const char *spec_accept_rule_name(dfl_accept_rule r) { return r == DFL_ACCEPT_MATCH ? "match" : "pq"; }

int spec_accept_rule_parse(const char *s) {
    if (strcmp(s, "pq") == 0) return DFL_ACCEPT_PQ;
    if (strcmp(s, "match") == 0) return DFL_ACCEPT_MATCH;
    return -1;
}

int spec_generate(dfl_state *s, dfl_draft_if *dr, const int32_t *prompt, int n_prompt, const dfl_gen_opts *o,
                  int32_t *out, dfl_gen_stats *st, dfl_token_cb cb, void *ud) {
    const dfl_model *m = s->m;
    const int V = m->cfg.vocab, H = m->cfg.hidden;
    const int B = dr ? o->block : 1, no_record0 = s->no_record;
    const int ids_only = o->temperature <= 0 && !o->on_logits; /* greedy: each row's argmax is all we read */
    memset(st, 0, sizeof *st);
    st->prompt_tokens = n_prompt;
    st->max_block = B;
    st->stop = "max_new";
    st->accept_rule = o->temperature > 0 ? spec_accept_rule_name(o->accept_rule) : "greedy";
    if (o->max_new < 0) return dfl_seterr("max_new must be >= 0");
    /* a round verifies at most the tokens max_new leaves: a short run needs no batch of a full block */
    if (dr && (B < 2 || B > DFL_MAX_BLOCK || (B < o->max_new ? B : o->max_new) > s->max_batch))
        return dfl_seterr("block size %d: must be in [2, %d] and fit the run state (%d)", B, DFL_MAX_BLOCK,
                          s->max_batch);
    if (dr && !s->record) return dfl_seterr("speculative decoding needs a run state with rollback records");
    const int N = dr ? o->tree_budget : 0;
    if (N < 0 || N > DDTREE_MAX_BUDGET) return dfl_seterr("tree budget %d: must be in [0, %d]", N, DDTREE_MAX_BUDGET);
    if (N > 0 && o->temperature > 0)
        return dfl_seterr("tree verification (DDTree) is greedy: use temperature 0 or chain verification");
    if (!(o->top_p >= 0 && o->top_p <= 1)) return dfl_seterr("top_p must be in (0, 1] (0 = off), found %g", o->top_p);
    if (o->top_k < 0) return dfl_seterr("top_k must be >= 0 (0 = off), found %d", o->top_k);
    if (N > 0 && s->tree_cap < N + 1)
        return dfl_seterr("tree budget %d needs a run state with tree verification for %d nodes (has %d)", N, N + 1,
                          s->tree_cap);
    if (n_prompt < 1) return dfl_seterr("empty prompt");
    const int tree_slots = dr && o->tree_budget > 0 ? o->tree_budget : 0; /* a tree's nodes use slots past start */
    if (n_prompt + o->max_new + tree_slots > s->max_ctx)
        return dfl_seterr("prompt (%d tokens) + max_new %d%s exceed the context of %d", n_prompt, o->max_new,
                          tree_slots ? " + tree budget" : "", s->max_ctx);
    if (dr && dr->context_len(dr->ctx) != 0) return dfl_seterr("drafter context is not empty");
    const int chunk = s->max_batch, nf = dr ? dr->n_feature_layers : 0;
    const int rows = chunk > B ? (chunk > N + 1 ? chunk : N + 1) : (B > N + 1 ? B : N + 1);
    float *logits = malloc((size_t)(B > N + 1 ? B : N + 1) * V * sizeof(float));
    float *probs = malloc((size_t)V * sizeof(float));
    dfl_ranked *rank = o->temperature > 0 ? malloc((size_t)V * sizeof *rank) : NULL; /* the sampling filter's */
    float *dlogits = dr ? malloc((size_t)B * V * sizeof(float)) : NULL;
    float *feat = dr ? malloc((size_t)rows * nf * H * sizeof(float)) : NULL;
    /* every prompt row's logits, for opts.prompt_logits */
    const int want_plog = o->on_logits && o->prompt_logits;
    float *plog = want_plog ? malloc((size_t)(n_prompt < chunk ? n_prompt : chunk) * V * sizeof(float)) : NULL;
    int rc = DFL_ERR;
    dfl_tree tree = {0}; /* before the first goto: the cleanup frees it */
    if (!logits || !probs || (o->temperature > 0 && !rank) || (dr && (!dlogits || !feat)) || (want_plog && !plog)) {
        dfl_seterr("out of memory for generation buffers");
        goto done;
    }
    if (N > 0 && ddtree_alloc(&tree, N) != DFL_OK) goto done;
    dfl_rng rng;
    rng_seed(&rng, o->seed);
    gen g = {.m = m, .o = o, .st = st, .out = out, .cb = cb, .ud = ud};
    dfl_capture cap = {.n_layers = nf, .layers = dr ? dr->feature_layers : NULL, .out = feat};

    /* 1. prefill, capturing the prompt's features for the drafter; only block verifications are
     * ever rolled back, so the prefill and plain decode steps skip the rollback record */
    s->no_record = 1;
    double t0 = dfl_now();
    for (int c0 = 0; c0 < n_prompt; c0 += chunk) {
        const int n = n_prompt - c0 < chunk ? n_prompt - c0 : chunk;
        const int last = c0 + n == n_prompt;
        if (want_plog) {
            if (model_forward(s, prompt + c0, n, plog, 0, dr ? &cap : NULL)) goto done;
            for (int r = 0; r < n && c0 + r + 1 < n_prompt; r++)
                o->on_logits(o->on_logits_ud, 1, c0 + r + 1, prompt[c0 + r + 1], plog + (size_t)r * V, V);
            if (last) memcpy(logits, plog + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
        } else if (model_forward(s, prompt + c0, n, last ? logits : NULL, 1, dr ? &cap : NULL)) {
            goto done;
        }
        if (dr && dr->add_context(dr->ctx, feat, prompt + c0, n)) goto done;
    }
    st->t_prefill = dfl_now() - t0;
    if (o->max_new == 0) { /* the prefill only */
        rc = DFL_OK;
        goto done;
    }
    int32_t first = pick(logits, V, o, probs, rank, &rng);
    st->t_prefill = dfl_now() - t0;
    t0 = dfl_now();
    const float *row0 = logits;
    commit(&g, &first, 1, &row0);

    int32_t block[DFL_MAX_BLOCK], acc[DFL_MAX_BLOCK];
    while (!g.stopped) {
        const int32_t anchor = out[g.n_out - 1];
        const int start = s->n_past;
        int bs = o->max_new - g.n_out < B ? o->max_new - g.n_out : B; /* tokens this round can add */
        if (bs < 1) bs = 1;
        double tv = dfl_now();
        if (bs > 1 && dr->skip && dr->skip(dr->ctx)) bs = 1;
        if (bs == 1) { /* a plain decode step (also the last step of a speculative run, or one the drafter skips) */
            int32_t next;
            if (verify_forward(s, &anchor, NULL, 1, 1, logits, &next, ids_only, dr ? &cap : NULL)) goto done;
            st->t_verify += dfl_now() - tv;
            if (!ids_only) next = pick(logits, V, o, probs, rank, &rng);
            if (dr) {
                double tr = dfl_now();
                if (dr->add_context(dr->ctx, feat, &anchor, 1)) goto done;
                st->t_draft += dfl_now() - tr;
            }
            st->rounds++;
            st->accept_hist[0]++;
            if (o->on_round) o->on_round(o->on_round_ud, start, &anchor, 1, NULL, V, 0);
            commit(&g, &next, 1, &row0);
            continue;
        }
        /* 2. draft; the drafter's context must end right before the anchor */
        double td = dfl_now();
        if (dr->context_len(dr->ctx) != start) {
            st->ctx_check_failures++;
            dfl_seterr("drafter context holds %d positions but %d are committed (the anchor must not be in it)",
                       dr->context_len(dr->ctx), start);
            goto done;
        }
        if (dr->draft(dr->ctx, anchor, bs, dlogits)) goto done;
        if (N > 0) {
            st->t_draft += dfl_now() - td;
            if (tree_round(s, dr, &tree, N, anchor, start, bs, dlogits, logits, feat, &cap, st, o, &g)) goto done;
            continue;
        }
        block[0] = anchor;
        for (int k = 1; k < bs; k++) {
            float *q = dlogits + (size_t)(k - 1) * V;
            if (o->temperature > 0 && o->accept_rule == DFL_ACCEPT_PQ) {
                sampling_probs(q, q, V, o, rank); /* keep q_k (filtered as p is) for the acceptance test */
                block[k] = sample(q, V, &rng);
            } else {
                block[k] = kn_argmax(q, V);
            }
        }
        st->t_draft += dfl_now() - td;
        /* 3. verify the block in one forward on top of the cache */
        tv = dfl_now();
        s->no_record = 0;
        int32_t ids[DFL_MAX_BLOCK];
        const int fw = verify_forward(s, block, NULL, bs, 0, logits, ids, ids_only, &cap);
        s->no_record = 1;
        if (fw) goto done;
        int a = 0;
        int32_t bonus;
        if (ids_only) {
            while (a < bs - 1 && block[a + 1] == ids[a]) a++;
            bonus = ids[a];
        } else if (o->temperature <= 0) {
            while (a < bs - 1 && block[a + 1] == kn_argmax(logits + (size_t)a * V, V)) a++;
            bonus = kn_argmax(logits + (size_t)a * V, V);
        } else if (o->accept_rule == DFL_ACCEPT_MATCH) {
            for (;; a++) { /* the target samples each position; greedy drafts are kept while they agree */
                sampling_probs(probs, logits + (size_t)a * V, V, o, rank);
                bonus = sample(probs, V, &rng);
                if (a == bs - 1 || bonus != block[a + 1]) break;
            }
        } else {
            bonus = -1;
            for (; a < bs - 1; a++) {
                sampling_probs(probs, logits + (size_t)a * V, V, o, rank);
                const float *q = dlogits + (size_t)a * V;
                const int32_t d = block[a + 1];
                if (rng_uniform(&rng) * q[d] < probs[d]) continue; /* accept with min(1, p/q) */
                double left = 0;
                for (int i = 0; i < V; i++) left += probs[i] > q[i] ? probs[i] - q[i] : 0.0f;
                /* a rejection needs p(d) < q(d), so p - q has positive mass elsewhere; where
                 * rounding leaves none (p and q equal to float precision), sample p itself
                 * rather than an all-zero vector (token 0) */
                if (left > 0)
                    for (int i = 0; i < V; i++) probs[i] = probs[i] > q[i] ? probs[i] - q[i] : 0.0f;
                bonus = sample(probs, V, &rng); /* from norm(max(0, p - q)) */
                break;
            }
            if (bonus < 0) { /* every draft accepted: the bonus comes from p at the last row */
                sampling_probs(probs, logits + (size_t)a * V, V, o, rank);
                bonus = sample(probs, V, &rng);
            }
        }
        st->t_verify += dfl_now() - tv;
        /* 4. exact rollback to the committed positions: anchor + a accepted drafts */
        double tr = dfl_now();
        if (state_rollback(s, start + a + 1)) goto done;
        st->t_rollback += dfl_now() - tr;
        /* 5. the new committed positions' features extend the drafter's context */
        td = dfl_now();
        if (dr->add_context(dr->ctx, feat, block, a + 1)) goto done;
        st->t_draft += dfl_now() - td;
        st->rounds++;
        st->drafted += bs - 1;
        st->accepted += a;
        st->accept_hist[a]++;
        for (int k = 1; k < bs; k++) {
            st->pos_drafted[k]++;
            if (k <= a) st->pos_accepted[k]++;
        }
        if (o->on_round) o->on_round(o->on_round_ud, start, block, bs, dlogits, V, a);
        for (int k = 0; k < a; k++) acc[k] = block[k + 1];
        acc[a] = bonus;
        const float *rows[DFL_MAX_BLOCK];
        for (int k = 0; k <= a; k++) rows[k] = logits + (size_t)k * V;
        commit(&g, acc, a + 1, rows);
    }
    st->t_decode = dfl_now() - t0;
    st->generated = g.n_out;
    if (o->extend > 0 && o->temperature <= 0 && strcmp(st->stop, "eos") == 0 && extend_past_eos(s, &g, logits))
        goto done;
    rc = DFL_OK;
done:
    s->no_record = no_record0;
    ddtree_free(&tree);
    free(logits), free(probs), free(rank), free(dlogits), free(feat), free(plog);
    return rc;
}
