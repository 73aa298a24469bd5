/* Target forward pass (docs/design.md §2–3): Qwen3 dense and Qwen3.5 hybrid layers, dense MLP or sparse
 * mixture of experts, over a batch of n new tokens on top of the cached context; run-state
 * allocation; rollback. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/model.h"
#include "backend/backend_internal.h"

static void cpu_state_free(dfl_target_state *s);
static void cpu_disable_tree(dfl_target_state *s);

/* MemAvailable, or no limit where it cannot be read (the allocations then say if they fail). */
static uint64_t mem_available(void) {
    const uint64_t b = dfl_mem_available();
    return b ? b : UINT64_MAX;
}

static int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

/* Inner rows per batch token of mlp1 / mlp2: the dense MLP, the k routed experts of a token
 * (gathered by expert) or the shared expert. */
static size_t inner_per_token(const dfl_config *g) {
    const size_t moe = moe_inner_per_token(g);
    return (size_t)g->intermediate > moe ? (size_t)g->intermediate : moe;
}

/* MoE scratch per batch token: router logits, k (expert, weight, row) triples, gathered inputs
 * and outputs [k, H], the shared-expert gate logit and output [H]. */
static size_t moe_per_token(const dfl_config *g) {
    if (g->n_experts == 0) return 0;
    const size_t k = (size_t)g->n_experts_per_tok;
    return (size_t)g->n_experts + 3 * k + 2 * k * g->hidden + 1 + (g->shared_intermediate > 0 ? g->hidden : 0);
}

/* The MoE block's job list, in 4-byte slots. */
static size_t moe_job_slots(const dfl_config *g) {
    return g->n_experts ? (2 * (size_t)g->n_experts + 2) * sizeof(kn_mm_job) / sizeof(float) : 0;
}

/* Scratch floats per batch token. */
static size_t scratch_per_token(const dfl_model *m) {
    const dfl_config *g = &m->cfg;
    size_t qw = (size_t)max3(g->n_heads * g->head_dim * 2, m->conv_dim, 1);
    size_t aw = (size_t)max3(g->n_heads * g->head_dim, g->lin_v_heads * g->lin_v_dim, 1);
    return 2 * (size_t)g->hidden + qw + 2 * (size_t)g->n_kv_heads * g->head_dim + aw +
           (size_t)g->lin_v_heads * g->lin_v_dim + 2 * (size_t)g->lin_v_heads + 2 * inner_per_token(g) +
           moe_per_token(g) + (size_t)g->rot_dim;
}

uint64_t target_state_bytes(const dfl_model *m, int max_ctx, int max_batch, int record) {
    const dfl_config *g = &m->cfg;
    uint64_t f = 0;
    size_t lin = (size_t)(g->conv_kernel - 1) * m->conv_dim + (size_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim;
    for (int i = 0; i < g->n_layers; i++) {
        if (g->layer_types[i] == DFL_LAYER_FULL) {
            f += 2ull * max_ctx * g->n_kv_heads * g->head_dim;
        } else {
            f += lin;
            if (record) f += lin + (uint64_t)max_batch * (m->conv_dim + 2 * g->lin_v_heads);
        }
    }
    f += (uint64_t)max_batch * scratch_per_token(m) + 2ull * g->n_experts + 1 + moe_job_slots(g); /* + expert counts */
    f += (uint64_t)omp_get_max_threads() * (g->n_heads / g->n_kv_heads) * max_ctx + g->rot_dim;   /* scores */
    return f * sizeof(float);
}

/* ALLOC: zeroed and cache-line aligned (activations, which kernels may stream into);
 * ALLOC_LAZY: calloc, whose large blocks take physical pages only when first written (the
 * caches sized by max_ctx). Both are released with free(). */
#define ALLOC(p, nfloats)                                    \
    do {                                                     \
        (p) = dfl_zalloc((size_t)(nfloats) * sizeof(float)); \
        if (!(p)) goto oom;                                  \
    } while (0)
#define ALLOC_LAZY(p, nfloats)                                                      \
    do {                                                                            \
        (p) = calloc((size_t)(nfloats) > 0 ? (size_t)(nfloats) : 1, sizeof(float)); \
        if (!(p)) goto oom;                                                         \
    } while (0)

static int cpu_state_init(dfl_target_state *s, const dfl_model *m, int max_ctx, int max_batch, int record) {
    memset(s, 0, sizeof *s);
    const dfl_config *g = &m->cfg;
    if (max_ctx < 1 || max_batch < 1 || max_batch > max_ctx)
        return dfl_seterr("state: invalid sizes (max context %d, max batch %d)", max_ctx, max_batch);
    uint64_t need = target_state_bytes(m, max_ctx, max_batch, record), avail = mem_available();
    if (need > avail)
        return dfl_seterr("context of %d tokens needs %.2f GiB of cache and scratch, but only %.2f GiB of memory is "
                          "available; lower --max-context",
                          max_ctx, need / 1073741824.0, avail / 1073741824.0);
    s->m = m;
    s->max_ctx = max_ctx;
    s->max_batch = max_batch;
    s->record = record;
    s->bytes = need;
    int L = g->n_layers;
    const size_t kv = (size_t)g->n_kv_heads * g->head_dim;
    const size_t conv = (size_t)(g->conv_kernel - 1) * m->conv_dim;
    const size_t S = (size_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim;
    const size_t B = (size_t)max_batch;
    const size_t qw = (size_t)max3(g->n_heads * g->head_dim * 2, m->conv_dim, 1);
    const size_t aw = (size_t)max3(g->n_heads * g->head_dim, g->lin_v_heads * g->lin_v_dim, 1);
    s->k_cache = calloc((size_t)L, sizeof(float *));
    s->v_cache = calloc((size_t)L, sizeof(float *));
    s->conv_state = calloc((size_t)L, sizeof(float *));
    s->rec_state = calloc((size_t)L, sizeof(float *));
    s->rec_conv0 = calloc((size_t)L, sizeof(float *));
    s->rec_S0 = calloc((size_t)L, sizeof(float *));
    s->rec_qkv = calloc((size_t)L, sizeof(float *));
    s->rec_ab = calloc((size_t)L, sizeof(float *));
    if (!s->k_cache || !s->v_cache || !s->conv_state || !s->rec_state || !s->rec_conv0 || !s->rec_S0 || !s->rec_qkv ||
        !s->rec_ab)
        goto oom;
    for (int i = 0; i < L; i++) {
        if (g->layer_types[i] == DFL_LAYER_FULL) {
            ALLOC_LAZY(s->k_cache[i], (size_t)max_ctx * kv);
            ALLOC_LAZY(s->v_cache[i], (size_t)max_ctx * kv);
        } else {
            ALLOC(s->conv_state[i], conv);
            ALLOC(s->rec_state[i], S);
            if (record) {
                ALLOC(s->rec_conv0[i], conv);
                ALLOC(s->rec_S0[i], S);
                ALLOC(s->rec_qkv[i], (size_t)max_batch * m->conv_dim);
                ALLOC(s->rec_ab[i], (size_t)max_batch * 2 * g->lin_v_heads);
            }
        }
    }
    ALLOC(s->x, B * g->hidden);
    ALLOC(s->xn, B * g->hidden);
    ALLOC(s->q, B * qw);
    ALLOC(s->k, B * kv);
    ALLOC(s->v, B * kv);
    ALLOC(s->att, B * aw);
    ALLOC(s->z, B * g->lin_v_heads * g->lin_v_dim);
    ALLOC(s->ab, B * 2 * g->lin_v_heads);
    ALLOC(s->mlp1, B * inner_per_token(g));
    ALLOC(s->mlp2, B * inner_per_token(g));
    if (g->n_experts > 0 && moe_buf_init(&s->moe, g, max_batch, NULL) != DFL_OK) goto oom; /* in state_bytes */
    ALLOC(s->scores, (size_t)omp_get_max_threads() * (g->n_heads / g->n_kv_heads) * max_ctx);
    ALLOC(s->rope_cos, B * g->rot_dim / 2);
    ALLOC(s->rope_sin, B * g->rot_dim / 2);
    ALLOC(s->inv_freq, g->rot_dim / 2);
    /* inv_freq_i = theta^(-2i/rot), in float32 as the reference computes it */
    for (int i = 0; i < g->rot_dim / 2; i++)
        s->inv_freq[i] = 1.0f / powf((float)g->rope_theta, (float)(2 * i) / (float)g->rot_dim);
    return DFL_OK;
oom:
    cpu_state_free(s);
    return dfl_seterr("out of memory allocating the run state (%.2f GiB)", need / 1073741824.0);
}

static void cpu_state_free(dfl_target_state *s) {
    if (s->m) {
        for (int i = 0; i < s->m->cfg.n_layers; i++) { /* each array on its own: init may fail between them */
            if (s->k_cache) free(s->k_cache[i]);
            if (s->v_cache) free(s->v_cache[i]);
            if (s->conv_state) free(s->conv_state[i]);
            if (s->rec_state) free(s->rec_state[i]);
            if (s->rec_conv0) free(s->rec_conv0[i]);
            if (s->rec_S0) free(s->rec_S0[i]);
            if (s->rec_qkv) free(s->rec_qkv[i]);
            if (s->rec_ab) free(s->rec_ab[i]);
        }
    }
    free(s->k_cache), free(s->v_cache), free(s->conv_state), free(s->rec_state);
    free(s->rec_conv0), free(s->rec_S0), free(s->rec_qkv), free(s->rec_ab);
    free(s->x), free(s->xn), free(s->q), free(s->k), free(s->v), free(s->att), free(s->z), free(s->ab);
    free(s->mlp1), free(s->mlp2), free(s->scores), free(s->rope_cos), free(s->rope_sin), free(s->inv_freq);
    moe_buf_free(&s->moe);
    if (s->m) cpu_disable_tree(s);
    memset(s, 0, sizeof *s);
}

static void cpu_state_reset(dfl_target_state *s) {
    const dfl_config *g = &s->m->cfg;
    const size_t conv = (size_t)(g->conv_kernel - 1) * s->m->conv_dim;
    const size_t S = (size_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim;
    for (int i = 0; i < g->n_layers; i++)
        if (g->layer_types[i] == DFL_LAYER_LINEAR) {
            memset(s->conv_state[i], 0, conv * sizeof(float));
            memset(s->rec_state[i], 0, S * sizeof(float));
        }
    s->n_past = 0;
    s->rec_n_past = 0, s->rec_n = -1;
    s->tree_n = 0;
}

void model_embed(const dfl_model *m, int32_t token, float *out) { kn_mat_row(&m->embed, token, out); }

void model_lm_head(const dfl_model *m, const float *x, float *logits, int n) {
    const kn_op kind = kn_prof_matmul_as(KN_OP_LM_HEAD); /* a profile tells it from the layers' products */
    kn_matmul(logits, x, &m->lm_head, n);
    kn_prof_matmul_as(kind);
}

int model_lm_head_argmax(const dfl_model *m, const float *x, float *logits, int32_t *ids, int n) {
    const kn_op kind = kn_prof_matmul_as(KN_OP_LM_HEAD);
    const int full = kn_matmul_argmax(ids, logits, x, &m->lm_head, n, m->head_norms);
    kn_prof_matmul_as(kind);
    return full;
}

/* ---- full attention layer ---------------------------------------------------------- */

static void attention_layer(dfl_target_state *s, int li, int n) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const dfl_layer_w *l = &m->layers[li];
    const int H = g->hidden, hd = g->head_dim, Hq = g->n_heads, Hkv = g->n_kv_heads, rot = g->rot_dim;
    const int gated = g->attn_gate;
    const int qstride = Hq * hd * (gated ? 2 : 1), kvw = Hkv * hd, p0 = s->n_past;
    kn_rmsnorm_rows(s->xn, s->x, l->input_norm, n, H, g->rms_eps);
    kn_matmul_multi(3, (float *[]){s->q, s->k, s->v}, s->xn, (const dfl_mat *[]){&l->q_proj, &l->k_proj, &l->v_proj},
                    n);
    float *kc = s->k_cache[li], *vc = s->v_cache[li];
    /* per-head norms and rotation; the new keys/values then go into the cache */
    for (int t = 0; t < n; t++) {
        const float *cs = s->rope_cos + (size_t)t * rot / 2, *sn = s->rope_sin + (size_t)t * rot / 2;
        kn_head_norm_rope(s->q + (size_t)t * qstride, Hq, (size_t)hd * (gated ? 2 : 1), l->q_norm, hd, g->rms_eps, cs,
                          sn, rot);
        kn_head_norm_rope(s->k + (size_t)t * kvw, Hkv, (size_t)hd, l->k_norm, hd, g->rms_eps, cs, sn, rot);
    }
    memcpy(kc + (size_t)p0 * kvw, s->k, (size_t)n * kvw * sizeof(float)); /* [n][kvw] rows at p0.. */
    memcpy(vc + (size_t)p0 * kvw, s->v, (size_t)n * kvw * sizeof(float));
    /* one causal block of n rows after the context; a tree sees only the node's ancestors */
    const kn_attn_io a = {.n = n,
                          .n_heads = Hq,
                          .n_kv_heads = Hkv,
                          .head_dim = hd,
                          .q = s->q,
                          .ldq = (size_t)qstride,
                          .ldqh = (size_t)hd * (gated ? 2 : 1),
                          .gate = gated ? s->q + hd : NULL,
                          .out = s->att,
                          .k = kc,
                          .v = vc,
                          .ldkv = (size_t)kvw,
                          .block = n,
                          .starts = &p0,
                          .causal = 1,
                          .tree = s->tree_parent ? s->tree_anc : NULL,
                          .ldtree = (size_t)s->max_batch,
                          .scores = s->scores,
                          .ldsc = (size_t)s->max_ctx};
    kn_attention(&a);
    kn_matmul(s->xn, s->att, &l->o_proj, n);
    kn_add(s->x, s->xn, (size_t)n * H);
}

/* ---- Gated DeltaNet layer ---------------------------------------------------------- */

/* Tree layout of a linear-layer pass: token i continues the conv window and recurrent state of
 * parent[i] (the committed ones when parent[i] < 0), which stay unchanged; each node's inputs
 * are kept so that the committed path's window and state can be recomputed. NULL = chain: each
 * token continues the previous one, in place in conv_state / S. */
typedef struct lin_tree {
    const int *parent; /* [n] */
    kn_gdn_tree gdn;   /* depth-first order, depths, per-thread state stacks */
    float *xin;        /* [n, conv_dim] conv inputs */
} lin_tree;

/* Advance one linear layer's conv window and recurrent state over n tokens. S0: a chain's
 * state to continue from, left unchanged, with the result in S (NULL: S itself).
 * qkv: [n, conv_dim] pre-conv projections, overwritten with the conv+SiLU output (q and k then
 * L2-normalised, q scaled). ab: [n, 2*Hv] raw a | b projections. out: [n, Hv*dv] core output,
 * or NULL (state only). A chain of KN_GDN_CHUNK tokens or more with an output (prefill) runs the
 * chunked form; shorter ones (decode, verification), state-only replays and trees run the
 * per-token recurrence, so that a verified block and its replay follow the same operations. */
static void gated_delta(const dfl_model *m, const dfl_layer_w *l, float *conv_state, float *S, const float *S0c,
                        float *qkv, const float *ab, int n, float *out, const lin_tree *tree) {
    const dfl_config *g = &m->cfg;
    const int C = m->conv_dim, K = g->conv_kernel, Hk = g->lin_k_heads, Hv = g->lin_v_heads, dk = g->lin_k_dim;
    kn_causal_conv_silu(qkv, n, C, K, l->conv_w, conv_state, tree ? tree->parent : NULL, tree ? tree->xin : NULL);
    /* L2-normalise q and k per (token, key head); q also scaled by 1/sqrt(dk) */
    kn_l2norm_heads(qkv, (size_t)C, n, Hk, dk, 1.0f / sqrtf((float)dk));
    kn_l2norm_heads(qkv + (size_t)Hk * dk, (size_t)C, n, Hk, dk, 1.0f);
    const kn_gdn_heads_io io = {.n = n,
                                .Hk = Hk,
                                .Hv = Hv,
                                .dk = dk,
                                .dv = g->lin_v_dim,
                                .qkv = qkv,
                                .ld = (size_t)C,
                                .ab = ab,
                                .neg_exp_A = l->neg_exp_A,
                                .dt_bias = l->dt_bias,
                                .S = S,
                                .S0 = S0c,
                                .out = out,
                                .chunked = !tree && out && n >= KN_GDN_CHUNK,
                                .tree = tree ? &tree->gdn : NULL};
    kn_gdn_heads(&io);
}

static void linear_layer(dfl_target_state *s, int li, int n) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const dfl_layer_w *l = &m->layers[li];
    const int H = g->hidden, Hv = g->lin_v_heads, dv = g->lin_v_dim, C = m->conv_dim;
    /* a tree keeps each node's recurrence inputs (conv output, gates) for its commit
     * (tree_path_state): they are computed in the layer's node tables, not copied there */
    const int keep = s->tree_parent && s->tree_qkv;
    float *qkv = keep ? s->tree_qkv[li] : s->q, *ab = keep ? s->tree_ab[li] : s->ab;
    kn_rmsnorm_rows(s->xn, s->x, l->input_norm, n, H, g->rms_eps);
    kn_matmul_multi(4, (float *[]){qkv, s->z, s->att, s->att + (size_t)n * Hv}, s->xn,
                    (const dfl_mat *[]){&l->in_qkv, &l->in_z, &l->in_a, &l->in_b}, n);
    /* a and b side by side: ab[t] = [a_0..a_Hv-1 | b_0..b_Hv-1] */
    for (int t = 0; t < n; t++) {
        memcpy(ab + (size_t)t * 2 * Hv, s->att + (size_t)t * Hv, (size_t)Hv * sizeof(float));
        memcpy(ab + (size_t)t * 2 * Hv + Hv, s->att + (size_t)n * Hv + (size_t)t * Hv, (size_t)Hv * sizeof(float));
    }
    const float *S0 = NULL;
    if (s->rec_n > 0) {
        const size_t conv = (size_t)(g->conv_kernel - 1) * C;
        memcpy(s->rec_conv0[li], s->conv_state[li], conv * sizeof(float));
        /* the state before the forward is kept by swapping buffers: the recurrence reads it
         * from rec_S0 and writes the new one, saving a copy of [Hv, dk, dv] per layer */
        float *t = s->rec_S0[li];
        s->rec_S0[li] = s->rec_state[li], s->rec_state[li] = t;
        S0 = s->rec_S0[li];
        memcpy(s->rec_qkv[li], qkv, (size_t)n * C * sizeof(float));
        memcpy(s->rec_ab[li], ab, (size_t)n * 2 * Hv * sizeof(float));
    }
    lin_tree tree = {.parent = s->tree_parent,
                     .gdn = {.order = s->tree_order,
                             .depth = s->tree_depth,
                             .stack = s->tree_stack,
                             .levels = s->tree_levels,
                             .threads = s->tree_threads},
                     .xin = s->tree_xin ? s->tree_xin[li] : NULL};
    gated_delta(m, l, s->conv_state[li], s->rec_state[li], S0, qkv, ab, n, s->att, s->tree_parent ? &tree : NULL);
    /* gated RMSNorm per (token, value head): w * norm(o) * silu(z), into z */
    kn_rmsnorm_rows(s->att, s->att, l->gnorm, n * Hv, dv, g->rms_eps);
    kn_swiglu_par(s->z, s->att, (size_t)n * Hv * dv);
    kn_matmul(s->xn, s->z, &l->out_proj, n);
    kn_add(s->x, s->xn, (size_t)n * H);
}

size_t moe_inner_per_token(const dfl_config *g) {
    return (size_t)g->n_experts_per_tok * g->moe_intermediate + (size_t)g->shared_intermediate;
}

int moe_buf_init(dfl_moe_buf *b, const dfl_config *g, int rows, uint64_t *bytes) {
    const size_t E = (size_t)g->n_experts, k = (size_t)g->n_experts_per_tok, B = (size_t)rows, H = (size_t)g->hidden;
    const size_t S = g->shared_intermediate > 0 ? B * H : 0;
    b->logits = dfl_zalloc(B * E * sizeof(float));
    b->idx = dfl_zalloc(B * k * sizeof(int));
    b->w = dfl_zalloc(B * k * sizeof(float));
    b->rows = dfl_zalloc(B * k * sizeof(int));
    b->count = dfl_zalloc((2 * E + 1) * sizeof(int));
    b->x = dfl_zalloc(B * k * H * sizeof(float));
    b->y = dfl_zalloc(B * k * H * sizeof(float));
    b->sh = dfl_zalloc(B * sizeof(float));
    b->sy = S ? dfl_zalloc(S * sizeof(float)) : NULL;
    b->jobs = dfl_zalloc((2 * E + 2) * sizeof(kn_mm_job));
    if (!b->logits || !b->idx || !b->w || !b->rows || !b->count || !b->x || !b->y || !b->sh || (S && !b->sy) ||
        !b->jobs) {
        moe_buf_free(b);
        return dfl_seterr("out of memory allocating the MoE scratch for %d rows", rows);
    }
    /* as state_bytes counts them: 4-byte slots */
    if (bytes) *bytes += (B * E + 3 * B * k + 2 * E + 1 + 2 * B * k * H + B + S) * sizeof(float) + moe_job_slots(g) * 4;
    return DFL_OK;
}

void moe_buf_free(dfl_moe_buf *b) {
    free(b->logits), free(b->idx), free(b->w), free(b->rows), free(b->count), free(b->x), free(b->y), free(b->sh);
    free(b->sy), free(b->jobs);
    memset(b, 0, sizeof *b);
}

/* The n*k (token, expert) pairs are grouped by expert so that each touched expert's weights
 * stream once for all its tokens; every row goes through the same kernels whatever the batch, so
 * a token's output does not depend on the other tokens of the forward. The gate and up products
 * of every touched expert and of the shared expert go through one kn_matmul_jobs list (one
 * parallel region whose threads claim the row blocks of all of them), their down products
 * through a second: two barriers per layer instead of two per expert, and experts too small to
 * split over the threads one by one still keep every thread streaming. mlp1 / mlp2 hold the
 * routed experts' rows (expert e's at start[e] * Ie) then the shared expert's. */
int moe_forward(const dfl_config *g, const dfl_layer_w *l, dfl_moe_buf *b, const float *xn, float *x, float *mlp1,
                float *mlp2, int n) {
    const int H = g->hidden, E = g->n_experts, k = g->n_experts_per_tok, Ie = g->moe_intermediate;
    const int Is = g->shared_intermediate;
    int *start = b->count, *cursor = b->count + E + 1; /* [E + 1] row offsets, [E] fill */
    int touched = 0, nj = 0;
    kn_matmul(b->logits, xn, &l->router, n);
    memset(start, 0, (size_t)(E + 1) * sizeof(int));
    for (int t = 0; t < n; t++) {
        kn_moe_route(b->logits + (size_t)t * E, E, k, g->norm_topk_prob, b->idx + (size_t)t * k, b->w + (size_t)t * k);
        for (int j = 0; j < k; j++) start[b->idx[(size_t)t * k + j] + 1]++;
    }
    for (int e = 0; e < E; e++) start[e + 1] += start[e], cursor[e] = start[e];
    for (int t = 0; t < n; t++) /* gather: expert e's rows are start[e] .. start[e+1]-1, in token order */
        for (int j = 0; j < k; j++) {
            const int r = cursor[b->idx[(size_t)t * k + j]]++;
            b->rows[(size_t)t * k + j] = r;
            memcpy(b->x + (size_t)r * H, xn + (size_t)t * H, (size_t)H * sizeof(float));
        }
    const size_t nk = (size_t)n * k, sh_off = nk * Ie; /* the shared expert's rows in mlp1 / mlp2 */
    kn_mm_job *jobs = b->jobs;
    for (int e = 0; e < E; e++) { /* gate and up: expert e's rows of b->x into its rows of mlp1 / mlp2 */
        const int cnt = start[e + 1] - start[e];
        if (!cnt) continue;
        touched++;
        const size_t r = (size_t)start[e];
        jobs[nj++] = (kn_mm_job){mlp1 + r * Ie, b->x + r * H, &l->exp_gate[e], cnt};
        jobs[nj++] = (kn_mm_job){mlp2 + r * Ie, b->x + r * H, &l->exp_up[e], cnt};
    }
    if (Is > 0) {
        jobs[nj++] = (kn_mm_job){mlp1 + sh_off, xn, &l->sh_gate, n};
        jobs[nj++] = (kn_mm_job){mlp2 + sh_off, xn, &l->sh_up, n};
    }
    kn_matmul_jobs(nj, jobs);
    kn_swiglu_par(mlp1, mlp2, sh_off + (size_t)n * (Is > 0 ? Is : 0));
    nj = 0;
    for (int e = 0; e < E; e++) { /* down: into expert e's rows of b->y */
        const int cnt = start[e + 1] - start[e];
        if (cnt)
            jobs[nj++] = (kn_mm_job){b->y + (size_t)start[e] * H, mlp1 + (size_t)start[e] * Ie, &l->exp_down[e], cnt};
    }
    if (Is > 0) jobs[nj++] = (kn_mm_job){b->sy, mlp1 + sh_off, &l->sh_down, n};
    kn_matmul_jobs(nj, jobs);
    /* combine into b->x (free now): out_t = sum over its experts, ascending id, of w * y */
    kn_gather_sum(b->x, b->y, b->rows, b->w, n, k, H);
    if (Is > 0) { /* + sigmoid(sh_score . x) * shared_expert(x) */
        kn_matmul(b->sh, xn, &l->sh_score, n);
        for (int t = 0; t < n; t++) kn_add_scaled(b->x + (size_t)t * H, kn_sigmoid(b->sh[t]), b->sy + (size_t)t * H, H);
    }
    kn_add(x, b->x, (size_t)n * H);
    return touched;
}

static void mlp(dfl_target_state *s, int li, int n) {
    const dfl_config *g = &s->m->cfg;
    const dfl_layer_w *l = &s->m->layers[li];
    const int H = g->hidden, I = g->intermediate;
    kn_rmsnorm_rows(s->xn, s->x, l->post_norm, n, H, g->rms_eps);
    if (l->moe) {
        s->moe_touched += moe_forward(g, l, &s->moe, s->xn, s->x, s->mlp1, s->mlp2, n);
        return;
    }
    kn_matmul_multi(2, (float *[]){s->mlp1, s->mlp2}, s->xn, (const dfl_mat *[]){&l->gate, &l->up}, n);
    kn_swiglu_par(s->mlp1, s->mlp2, (size_t)n * I);
    kn_matmul(s->xn, s->mlp1, &l->down, n);
    kn_add(s->x, s->xn, (size_t)n * H);
}

/* The final norm and lm_head over the forward's rows [first, n): logits, or with ids each row's
 * argmax, logits then scratch that may not hold every row (kn_matmul_argmax). */
static int head_rows(dfl_target_state *s, const int32_t *tokens, int n, const int *depth, int first, float *logits,
                     int32_t *ids) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const int H = g->hidden, rows = n - first;
    kn_rmsnorm_rows(s->xn, s->x + (size_t)first * H, m->final_norm, rows, H, g->rms_eps);
    if (!ids) model_lm_head(m, s->xn, logits, rows);
    else if (!model_lm_head_argmax(m, s->xn, logits, ids, rows)) return DFL_OK; /* the bound vouched: finite */
    /* NaN/Inf weights are not scanned at load (too costly on a large model) but they reach
     * the logits: stop there rather than decode garbage */
    if (!kn_count_nonfinite(logits, (size_t)rows * g->vocab)) return DFL_OK; /* fast path: none */
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * g->vocab;
        int bad = 0, nan = 0;
        for (int i = 0; i < g->vocab; i++)
            if (!isfinite(row[i])) bad++, nan += isnan(row[i]) != 0;
        if (bad) {
            const int t = first + r, pos = s->n_past - n + (depth ? depth[t] : t);
            return dfl_seterr("target logits are not finite at position %d (token %d; %d of %d values: %d NaN, "
                              "%d Inf): the checkpoint holds NaN/Inf weights or overflows; run dfl inspect "
                              "--check-weights %s",
                              pos, tokens[t], bad, g->vocab, nan, bad - nan, m->dir ? m->dir : "DIR");
        }
    }
    return DFL_OK;
}

/* A forward over n tokens (a tree's nodes where depth is given); logits of every row or the last
 * (logits_last_only), or with ids their argmaxes alone (head_rows). */
static int forward_impl(dfl_target_state *s, const int32_t *tokens, int n, const int *depth, float *logits,
                        int logits_last_only, const dfl_capture *cap, int32_t *ids) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const int H = g->hidden; /* sizes, tokens and capture layers: checked by the model API */
    for (int t = 0; t < n; t++) {
        model_embed(m, tokens[t], s->x + (size_t)t * H);
        const float p = (float)(s->n_past + (depth ? depth[t] : t)); /* tree nodes sit at start + depth */
        kn_rope_table(s->rope_cos + (size_t)t * g->rot_dim / 2, s->rope_sin + (size_t)t * g->rot_dim / 2, s->inv_freq,
                      g->rot_dim / 2, p);
    }
    s->moe_touched = 0;
    s->rec_n_past = s->n_past;
    s->rec_n = s->record && !s->no_record && !depth ? n : -1;
    for (int li = 0; li < g->n_layers; li++) {
        if (g->layer_types[li] == DFL_LAYER_FULL) attention_layer(s, li, n);
        else linear_layer(s, li, n);
        mlp(s, li, n);
        if (cap)
            for (int c = 0; c < cap->n_layers; c++)
                if (cap->layers[c] == li)
                    for (int t = 0; t < n; t++)
                        memcpy(cap->out + ((size_t)t * cap->n_layers + c) * H, s->x + (size_t)t * H,
                               (size_t)H * sizeof(float));
    }
    s->n_past += n;
    return logits ? head_rows(s, tokens, n, depth, logits_last_only ? n - 1 : 0, logits, ids) : DFL_OK;
}

static int cpu_rollback(dfl_target_state *s, int keep) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    /* keep is checked by the model API: inside the recorded forward, not n_past */
    const int n_keep = keep - s->rec_n_past, C = m->conv_dim, Hv = g->lin_v_heads;
    const size_t conv = (size_t)(g->conv_kernel - 1) * C, S = (size_t)Hv * g->lin_k_dim * g->lin_v_dim;
    for (int li = 0; li < g->n_layers; li++) {
        if (g->layer_types[li] != DFL_LAYER_LINEAR) continue;
        memcpy(s->conv_state[li], s->rec_conv0[li], conv * sizeof(float));
        if (n_keep > 0) { /* the replay reads rec_S0, which stays for a later, shorter rollback */
            memcpy(s->q, s->rec_qkv[li], (size_t)n_keep * C * sizeof(float));
            gated_delta(m, &m->layers[li], s->conv_state[li], s->rec_state[li], s->rec_S0[li], s->q, s->rec_ab[li],
                        n_keep, NULL, NULL);
        } else {
            memcpy(s->rec_state[li], s->rec_S0[li], S * sizeof(float));
        }
    }
    /* attention KV beyond keep is simply overwritten by the next forward */
    s->n_past = keep;
    s->rec_n = n_keep;
    return DFL_OK;
}

/* Depths the per-thread state stacks of tree forwards first hold: a DDTree is at most a block
 * deep; a deeper tree's forward grows them. */
#define TREE_LEVELS 32

static float *tree_stack_alloc(int threads, int levels, size_t head_S) {
    return aligned_alloc(64, ((size_t)threads * levels * head_S * sizeof(float) + 63) / 64 * 64);
}

static int cpu_enable_tree(dfl_target_state *s, int max_nodes) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    if (max_nodes < 1 || max_nodes > s->max_batch)
        return dfl_seterr("tree of %d nodes: must be in [1, %d] (the run state's batch)", max_nodes, s->max_batch);
    int n_lin = 0;
    for (int i = 0; i < g->n_layers; i++) n_lin += g->layer_types[i] == DFL_LAYER_LINEAR;
    const size_t node_in = 2 * (size_t)m->conv_dim + 2 * (size_t)g->lin_v_heads; /* a node's xin | qkv | ab */
    const size_t head_S = (size_t)g->lin_k_dim * g->lin_v_dim;
    const int threads = omp_get_max_threads(), levels = max_nodes < TREE_LEVELS ? max_nodes : TREE_LEVELS;
    const uint64_t need = (uint64_t)n_lin * max_nodes * node_in * sizeof(float) +
                          (uint64_t)max_nodes * (s->max_batch + 5 * sizeof(int)) +
                          (n_lin ? (uint64_t)threads * levels * head_S * sizeof(float) : 0);
    const uint64_t avail = mem_available();
    if (need > avail)
        return dfl_seterr("tree verification of %d nodes needs %.2f GiB for per-node linear-attention inputs, but only "
                          "%.2f GiB is available; lower the tree budget",
                          max_nodes, need / 1073741824.0, avail / 1073741824.0);
    cpu_disable_tree(s);
    s->tree_anc = calloc((size_t)max_nodes * s->max_batch, 1);
    s->tree_depth = calloc((size_t)max_nodes, sizeof(int));
    s->tree_par = calloc((size_t)max_nodes, sizeof(int));
    s->tree_order = calloc((size_t)max_nodes, sizeof(int));
    s->tree_link = calloc(2 * (size_t)max_nodes, sizeof(int));
    s->tree_stack = n_lin ? tree_stack_alloc(threads, levels, head_S) : NULL;
    s->tree_xin = calloc((size_t)g->n_layers, sizeof(float *));
    s->tree_qkv = calloc((size_t)g->n_layers, sizeof(float *));
    s->tree_ab = calloc((size_t)g->n_layers, sizeof(float *));
    if (!s->tree_anc || !s->tree_depth || !s->tree_par || !s->tree_order || !s->tree_link ||
        (n_lin && !s->tree_stack) || !s->tree_xin || !s->tree_qkv || !s->tree_ab)
        goto oom;
    for (int i = 0; i < g->n_layers; i++)
        if (g->layer_types[i] == DFL_LAYER_LINEAR) {
            s->tree_xin[i] = malloc((size_t)max_nodes * m->conv_dim * sizeof(float));
            s->tree_qkv[i] = malloc((size_t)max_nodes * m->conv_dim * sizeof(float));
            s->tree_ab[i] = malloc((size_t)max_nodes * 2 * g->lin_v_heads * sizeof(float));
            if (!s->tree_xin[i] || !s->tree_qkv[i] || !s->tree_ab[i]) goto oom;
        }
    s->tree_threads = threads, s->tree_levels = levels;
    s->tree_cap = max_nodes;
    s->bytes += need;
    return DFL_OK;
oom:
    cpu_disable_tree(s);
    return dfl_seterr("out of memory for tree verification states (%.2f GiB)", need / 1073741824.0);
}

static void cpu_disable_tree(dfl_target_state *s) {
    for (int i = 0; i < s->m->cfg.n_layers; i++) { /* each array on its own: enable may fail between them */
        if (s->tree_xin) free(s->tree_xin[i]);
        if (s->tree_qkv) free(s->tree_qkv[i]);
        if (s->tree_ab) free(s->tree_ab[i]);
    }
    free(s->tree_xin), free(s->tree_qkv), free(s->tree_ab);
    free(s->tree_anc), free(s->tree_depth), free(s->tree_par), free(s->tree_order), free(s->tree_link);
    free(s->tree_stack);
    s->tree_xin = s->tree_qkv = s->tree_ab = NULL;
    s->tree_anc = NULL;
    s->tree_depth = s->tree_par = s->tree_order = s->tree_link = NULL;
    s->tree_stack = NULL;
    s->tree_parent = NULL;
    s->tree_cap = s->tree_n = s->tree_threads = s->tree_levels = 0;
}

/* The depth-first preorder of the tree in tree_par (children in index order) into tree_order:
 * linked children, then a walk that climbs back to the next sibling after each leaf. */
static void tree_order(dfl_target_state *s, int n) {
    int *first = s->tree_link, *next = s->tree_link + s->tree_cap;
    for (int i = 0; i < n; i++) first[i] = next[i] = -1;
    for (int i = n - 1; i > 0; i--) next[i] = first[s->tree_par[i]], first[s->tree_par[i]] = i;
    for (int u = 0, k = 0; u >= 0;) {
        s->tree_order[k++] = u;
        if (first[u] >= 0) {
            u = first[u];
            continue;
        }
        while (u >= 0 && next[u] < 0) u = s->tree_par[u];
        if (u >= 0) u = next[u];
    }
}

/* Room in the per-thread state stacks for `levels` depths (levels <= tree_cap): doubled at least,
 * so that deeper and deeper trees reallocate seldom. */
static int tree_stack_fit(dfl_target_state *s, int levels) {
    if (levels <= s->tree_levels || !s->tree_stack) return DFL_OK;
    const dfl_config *g = &s->m->cfg;
    const size_t head_S = (size_t)g->lin_k_dim * g->lin_v_dim;
    if (levels < 2 * s->tree_levels) levels = 2 * s->tree_levels < s->tree_cap ? 2 * s->tree_levels : s->tree_cap;
    float *st = tree_stack_alloc(s->tree_threads, levels, head_S);
    if (!st) return dfl_seterr("out of memory for a tree %d deep (per-thread linear-attention states)", levels);
    s->bytes += (uint64_t)s->tree_threads * (levels - s->tree_levels) * head_S * sizeof(float);
    free(s->tree_stack);
    s->tree_stack = st, s->tree_levels = levels;
    return DFL_OK;
}

static int cpu_forward_tree(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, float *logits,
                            const dfl_capture *cap, int32_t *ids) {
    int deepest = 0;
    for (int i = 0; i < n; i++) {
        if (parent[i] >= i || (i > 0 && parent[i] < 0) || (i == 0 && parent[0] != -1)) {
            s->tree_n = 0; /* the last tree's node tables are partly overwritten: no commit */
            return dfl_seterr("tree node %d: parent %d (node 0 is the root with parent -1; parents precede children)",
                              i, parent[i]);
        }
        s->tree_depth[i] = i == 0 ? 0 : s->tree_depth[parent[i]] + 1;
        s->tree_par[i] = parent[i];
        unsigned char *row = s->tree_anc + (size_t)i * s->max_batch;
        memset(row, 0, (size_t)s->max_batch);
        if (i > 0) memcpy(row, s->tree_anc + (size_t)parent[i] * s->max_batch, (size_t)i);
        row[i] = 1;
        deepest = s->tree_depth[i] > deepest ? s->tree_depth[i] : deepest;
    }
    if (tree_stack_fit(s, deepest + 1)) {
        s->tree_n = 0;
        return DFL_ERR;
    }
    tree_order(s, n);
    s->tree_parent = parent;
    const int base = s->n_past;
    int rc = forward_impl(s, tokens, n, s->tree_depth, logits, 0, cap, ids);
    s->tree_parent = NULL;
    s->tree_base = base;
    s->tree_n = rc == DFL_OK ? n : 0;
    return rc;
}

/* The recurrent state after the tree path path[0..len-1] in linear layer li, into rec_state[li]
 * (the committed state before the tree): the path's kept inputs gathered into the forward's
 * scratch and run as a chain, whose tokens take the same steps as the forward's nodes, so bit
 * for bit the state the forward computed and did not keep. */
static void tree_path_state(dfl_target_state *s, int li, const int *path, int len) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const dfl_layer_w *l = &m->layers[li];
    const int C = m->conv_dim, Hv = g->lin_v_heads;
    for (int k = 0; k < len; k++) {
        memcpy(s->q + (size_t)k * C, s->tree_qkv[li] + (size_t)path[k] * C, (size_t)C * sizeof(float));
        memcpy(s->ab + (size_t)k * 2 * Hv, s->tree_ab[li] + (size_t)path[k] * 2 * Hv, 2 * (size_t)Hv * sizeof(float));
    }
    const kn_gdn_heads_io io = {.n = len,
                                .Hk = g->lin_k_heads,
                                .Hv = Hv,
                                .dk = g->lin_k_dim,
                                .dv = g->lin_v_dim,
                                .qkv = s->q,
                                .ld = (size_t)C,
                                .ab = s->ab,
                                .neg_exp_A = l->neg_exp_A,
                                .dt_bias = l->dt_bias,
                                .S = s->rec_state[li]};
    kn_gdn_heads(&io);
}

static int cpu_tree_commit(dfl_target_state *s, const int *path, int len) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    if (s->tree_n == 0 || len < 1 || len > s->tree_n || path[0] != 0)
        return dfl_seterr("tree commit: a path of %d nodes must start at the root of the last tree forward", len);
    for (int k = 1; k < len; k++)
        if (path[k] <= path[k - 1] || path[k] >= s->tree_n || s->tree_par[path[k]] != path[k - 1])
            return dfl_seterr("tree commit: node %d at step %d is not a child of node %d", path[k], k, path[k - 1]);
    const int kvw = g->n_kv_heads * g->head_dim, base = s->tree_base;
    for (int li = 0; li < g->n_layers; li++) {
        if (g->layer_types[li] == DFL_LAYER_FULL) {
            /* compact the path's K/V to consecutive slots; path[k] >= k, and a later path node's
             * slot is never a destination before it is read */
            for (int k = 1; k < len; k++) {
                memmove(s->k_cache[li] + (size_t)(base + k) * kvw, s->k_cache[li] + (size_t)(base + path[k]) * kvw,
                        (size_t)kvw * sizeof(float));
                memmove(s->v_cache[li] + (size_t)(base + k) * kvw, s->v_cache[li] + (size_t)(base + path[k]) * kvw,
                        (size_t)kvw * sizeof(float));
            }
        } else {
            kn_conv_window(s->conv_state[li], s->conv_state[li], s->tree_xin[li], path, len, m->conv_dim,
                           g->conv_kernel);
            tree_path_state(s, li, path, len);
        }
    }
    s->n_past = base + len;
    s->tree_n = 0;
    return DFL_OK;
}

/* The CPU backend's forward: a chain or a tree. Argmax rows: where the caller reads no logits,
 * found by the lm_head itself (kn_matmul_argmax), else from the host logits. */
static int cpu_forward(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, const dfl_fwd_out *o) {
    const int V = s->m->cfg.vocab, rows = parent || !o->last_only ? n : 1;
    float *logits = o->logits, *tmp = NULL;
    if (!logits && o->argmax) {
        logits = tmp = dfl_alloc((size_t)rows * V * sizeof(float));
        if (!tmp) return dfl_seterr("out of memory for %d rows of logits", rows);
    }
    int32_t *ids = o->argmax && (tmp || o->logits_scratch) ? o->argmax : NULL;
    const int rc = parent ? cpu_forward_tree(s, tokens, parent, n, logits, o->cap, ids)
                          : forward_impl(s, tokens, n, NULL, logits, o->last_only, o->cap, ids);
    if (rc == DFL_OK && o->argmax && !ids)
        for (int r = 0; r < rows; r++) o->argmax[r] = kn_argmax(logits + (size_t)r * V, V);
    free(tmp);
    return rc;
}

static int cpu_model_upload(dfl_model *m) {
    (void)m;
    return DFL_OK; /* the weights stay in the mmap */
}

static void cpu_model_release(dfl_model *m) { (void)m; }

const dfl_backend dfl_backend_cpu = {
    .name = "cpu",
    .model_upload = cpu_model_upload,
    .model_release = cpu_model_release,
    .target_state_init = cpu_state_init,
    .target_state_free = cpu_state_free,
    .target_state_reset = cpu_state_reset,
    .forward = cpu_forward,
    .rollback = cpu_rollback,
    .enable_tree = cpu_enable_tree,
    .disable_tree = cpu_disable_tree,
    .tree_commit = cpu_tree_commit,
};
