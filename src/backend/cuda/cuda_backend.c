/* The CUDA backend (dfl/backend.h, docs/backends.md): the target's forward as a sequence of the
 * ops of cuda_ops.h over weights uploaded once, caches and states on the GPU. Host code in C;
 * only what the caller asks for (logits, argmax ids, captured rows) comes back.
 * Supported: Qwen3 dense and Qwen3.5/3.6 hybrid targets with F32/F16/BF16 weights, dense MLPs.
 * Refused by name until they come: mixture-of-experts layers, FP8 weights. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"
#include "backend/cuda/cuda_ops.h"
#include "dfl/common.h"
#include "dfl/model.h"

static int cu_fail(cudaError_t e, const char *what) { return dfl_seterr("CUDA: %s (%s)", cudaGetErrorString(e), what); }
#define CK(call)                                          \
    do {                                                  \
        const cudaError_t e_ = (call);                    \
        if (e_ != cudaSuccess) return cu_fail(e_, #call); \
    } while (0)

int cuda_device_check(void) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return dfl_seterr("--device cuda: no usable GPU (%s)", cudaGetErrorString(e));
    if (n < 1) return dfl_seterr("--device cuda: no GPU found");
    return DFL_OK;
}

/* DFL_CUDA_PROFILE=1: GPU time per kind of op (CUDA events around each launch, which serialises
 * them: a profile, not a timing), printed to stderr at exit. */
enum { OP_MATMUL, OP_ATTN, OP_CONV, OP_REC, OP_NORM, OP_LOGITS, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"matmul",
                                               "attention (norm, rope, cache, softmax)",
                                               "conv + q/k l2 norm",
                                               "delta-rule recurrence",
                                               "rmsnorm, gates, residual",
                                               "final norm, lm_head, argmax"};
static int prof_on = -1;
static double prof_ms[OP_COUNT];
static long prof_calls[OP_COUNT];
static cudaEvent_t prof_e0, prof_e1;

static void prof_report(void) {
    double total = 0;
    for (int i = 0; i < OP_COUNT; i++) total += prof_ms[i];
    fprintf(stderr, "dfl cuda profile: %.1f ms of GPU time in ops\n", total);
    for (int i = 0; i < OP_COUNT; i++)
        fprintf(stderr, "  %-40s %9.2f ms %5.1f%% %8ld launches\n", op_names[i], prof_ms[i],
                total > 0 ? 100 * prof_ms[i] / total : 0, prof_calls[i]);
}

static int prof_enabled(void) {
    if (prof_on < 0) {
        const char *e = getenv("DFL_CUDA_PROFILE");
        prof_on = e && *e && strcmp(e, "0") != 0;
        if (prof_on) cudaEventCreate(&prof_e0), cudaEventCreate(&prof_e1), atexit(prof_report);
    }
    return prof_on;
}

#define OP(kind, call)                                    \
    do {                                                  \
        if (prof_enabled()) {                             \
            float ms_ = 0;                                \
            cudaEventRecord(prof_e0, 0);                  \
            call;                                         \
            cudaEventRecord(prof_e1, 0);                  \
            cudaEventSynchronize(prof_e1);                \
            cudaEventElapsedTime(&ms_, prof_e0, prof_e1); \
            prof_ms[kind] += ms_, prof_calls[kind]++;     \
        } else {                                          \
            call;                                         \
        }                                                 \
    } while (0)

/* Device allocations, freed together. */
typedef struct cu_pool {
    void **p;
    int n, cap;
    uint64_t bytes;
} cu_pool;

static void *pool_alloc(cu_pool *pl, size_t bytes) {
    if (pl->n == pl->cap) {
        const int cap = pl->cap ? 2 * pl->cap : 64;
        void **np = realloc(pl->p, (size_t)cap * sizeof *np);
        if (!np) return NULL;
        pl->p = np, pl->cap = cap;
    }
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state of a failed allocation */
        return NULL;
    }
    pl->p[pl->n++] = d;
    pl->bytes += bytes;
    return d;
}

static void pool_free(cu_pool *pl) {
    for (int i = 0; i < pl->n; i++) cudaFree(pl->p[i]);
    free(pl->p);
    memset(pl, 0, sizeof *pl);
}

/* ---- weights ------------------------------------------------------------------------------- */

typedef struct cu_layer {
    float *input_norm, *post_norm; /* [H] */
    cu_mat q, k, v, o;             /* full attention */
    float *q_norm, *k_norm;        /* [hd] */
    cu_mat qkv, z, a, b, out;      /* Gated DeltaNet */
    float *conv_w, *neg_exp_A, *dt_bias, *gnorm;
    cu_mat gate, up, down; /* dense MLP */
} cu_layer;

typedef struct cu_model {
    cu_pool pool;
    cu_layer *L; /* [n_layers] */
    cu_mat embed, lm_head;
    float *final_norm;
} cu_model;

static int up_mat(cu_pool *pl, const dfl_mat *m, cu_mat *out, const char *what, int layer) {
    cu_dtype dt;
    switch (m->dtype) {
    case ST_F32: dt = CU_F32; break;
    case ST_F16: dt = CU_F16; break;
    case ST_BF16: dt = CU_BF16; break;
    default:
        return dfl_seterr("layer %d %s: weights of dtype %s are not supported on cuda yet (F32, F16, BF16 are); use "
                          "--device cpu",
                          layer, what, st_dtype_name(m->dtype));
    }
    const size_t bytes = (size_t)m->rows * m->cols * st_dtype_size(m->dtype);
    void *d = pool_alloc(pl, bytes);
    if (!d) return dfl_seterr("out of GPU memory uploading layer %d %s (%.1f MB)", layer, what, bytes / 1e6);
    CK(cudaMemcpy(d, m->data, bytes, cudaMemcpyHostToDevice));
    *out = (cu_mat){.dtype = dt, .w = d, .rows = m->rows, .cols = m->cols};
    return DFL_OK;
}

static int up_vec(cu_pool *pl, const float *h, size_t n, float **out) {
    *out = pool_alloc(pl, n * sizeof(float));
    if (!*out) return dfl_seterr("out of GPU memory uploading a vector of %zu floats", n);
    CK(cudaMemcpy(*out, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return DFL_OK;
}

/* What this backend cannot run yet, by name. */
static int cu_supported(const dfl_model *m) {
    const dfl_config *g = &m->cfg;
    if (g->arch != DFL_ARCH_QWEN3 && g->arch != DFL_ARCH_QWEN3_5)
        return dfl_seterr("architecture %s is not a target the cuda backend runs", config_arch_name(g->arch));
    if (g->n_experts > 0)
        return dfl_seterr("mixture-of-experts targets (%d experts) are not supported on cuda yet; use --device cpu",
                          g->n_experts);
    if (g->head_dim > 1024) return dfl_seterr("head_dim %d: the cuda backend takes up to 1024", g->head_dim);
    for (int i = 0; i < g->n_layers; i++)
        if (g->layer_types[i] == DFL_LAYER_LINEAR) {
            if (!cu_gdn_supported(g->lin_k_dim, g->lin_v_dim))
                return dfl_seterr("Gated DeltaNet key dim %d / value dim %d: the cuda backend takes key dims 16, 32, "
                                  "64, 128 and value dims up to 1024",
                                  g->lin_k_dim, g->lin_v_dim);
            if (g->conv_kernel < 1 || g->conv_kernel > 16)
                return dfl_seterr("conv kernel %d: the cuda backend takes 1..16", g->conv_kernel);
            break;
        }
    return DFL_OK;
}

static int upload_layer(cu_pool *pl, const dfl_model *m, int li, cu_layer *d) {
    const dfl_config *g = &m->cfg;
    const dfl_layer_w *l = &m->layers[li];
    const int H = g->hidden;
    if (up_vec(pl, l->input_norm, (size_t)H, &d->input_norm) || up_vec(pl, l->post_norm, (size_t)H, &d->post_norm))
        return DFL_ERR;
    if (g->layer_types[li] == DFL_LAYER_FULL) {
        if (up_mat(pl, &l->q_proj, &d->q, "q_proj", li) || up_mat(pl, &l->k_proj, &d->k, "k_proj", li) ||
            up_mat(pl, &l->v_proj, &d->v, "v_proj", li) || up_mat(pl, &l->o_proj, &d->o, "o_proj", li) ||
            up_vec(pl, l->q_norm, (size_t)g->head_dim, &d->q_norm) ||
            up_vec(pl, l->k_norm, (size_t)g->head_dim, &d->k_norm))
            return DFL_ERR;
    } else {
        const int Hv = g->lin_v_heads;
        if (up_mat(pl, &l->in_qkv, &d->qkv, "in_proj_qkv", li) || up_mat(pl, &l->in_z, &d->z, "in_proj_z", li) ||
            up_mat(pl, &l->in_a, &d->a, "in_proj_a", li) || up_mat(pl, &l->in_b, &d->b, "in_proj_b", li) ||
            up_mat(pl, &l->out_proj, &d->out, "out_proj", li) ||
            up_vec(pl, l->conv_w, (size_t)m->conv_dim * g->conv_kernel, &d->conv_w) ||
            up_vec(pl, l->neg_exp_A, (size_t)Hv, &d->neg_exp_A) || up_vec(pl, l->dt_bias, (size_t)Hv, &d->dt_bias) ||
            up_vec(pl, l->gnorm, (size_t)g->lin_v_dim, &d->gnorm))
            return DFL_ERR;
    }
    if (up_mat(pl, &l->gate, &d->gate, "mlp.gate_proj", li) || up_mat(pl, &l->up, &d->up, "mlp.up_proj", li) ||
        up_mat(pl, &l->down, &d->down, "mlp.down_proj", li))
        return DFL_ERR;
    return DFL_OK;
}

static void cuda_model_release(dfl_model *m) {
    cu_model *d = m->dev;
    if (!d) return;
    pool_free(&d->pool);
    free(d->L);
    free(d);
    m->dev = NULL;
}

static int cuda_model_upload(dfl_model *m) {
    if (cu_supported(m) != DFL_OK) return DFL_ERR;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    if (m->weight_bytes > free_b)
        return dfl_seterr("the weights need %.2f GB of GPU memory, %.2f GB of %.2f GB are free", m->weight_bytes / 1e9,
                          free_b / 1e9, total_b / 1e9);
    cu_model *d = calloc(1, sizeof *d);
    if (!d || !(d->L = calloc((size_t)m->cfg.n_layers, sizeof *d->L))) {
        free(d);
        return dfl_seterr("out of memory");
    }
    m->dev = d;
    int rc = up_mat(&d->pool, &m->embed, &d->embed, "embed_tokens", -1);
    if (rc == DFL_OK)
        rc = m->lm_head.data == m->embed.data ? (d->lm_head = d->embed, DFL_OK)
                                              : up_mat(&d->pool, &m->lm_head, &d->lm_head, "lm_head", -1);
    if (rc == DFL_OK) rc = up_vec(&d->pool, m->final_norm, (size_t)m->cfg.hidden, &d->final_norm);
    for (int li = 0; rc == DFL_OK && li < m->cfg.n_layers; li++) rc = upload_layer(&d->pool, m, li, &d->L[li]);
    if (rc != DFL_OK) cuda_model_release(m);
    return rc;
}

/* ---- run state ----------------------------------------------------------------------------- */

typedef struct cu_state {
    cu_pool pool;
    float **kc, **vc;    /* [L] full layers: [max_ctx, Hkv*hd] */
    float **conv, **S;   /* [L] linear layers: [K-1, C] window, [Hv, dk, dv] state */
    float **conv0, **S0; /* [L] record: the window and state before the last forward */
    float **rqkv, **rab; /* [L] record: [B, C] pre-conv rows, [2, B, Hv] raw a then b */
    cu_pool tree_pool;
    float **tconv, **tS;          /* [L] tree: [cap, K-1, C] windows, [cap, Hv, dk, dv] states per node */
    int *anc, *depth, *par;       /* device [cap, B], [cap], [cap] */
    int *h_anc, *h_depth, *h_par; /* host copies */
    int32_t *tok, *pos, *ids;     /* [B] */
    unsigned *bad;
    float *x, *xn, *q, *k, *v, *att, *z, *a, *b, *mlp1, *mlp2, *logits, *scores, *inv_freq;
} cu_state;

static int is_full(const dfl_config *g, int li) { return g->layer_types[li] == DFL_LAYER_FULL; }

#define DALLOC(p, nfloats)                                             \
    do {                                                               \
        (p) = pool_alloc(&c->pool, (size_t)(nfloats) * sizeof(float)); \
        if (!(p)) goto oom;                                            \
    } while (0)

static void cuda_state_free(dfl_target_state *s);
static void cuda_state_reset(dfl_target_state *s);

/* inv_freq_i = theta^(-2i/rot), in float32 as the CPU backend computes it, to the device's dst. */
static cudaError_t upload_inv_freq(float *dst, const dfl_config *g) {
    float *inv = malloc(((size_t)g->rot_dim / 2 + 1) * sizeof(float));
    if (!inv) return cudaErrorMemoryAllocation;
    for (int i = 0; i < g->rot_dim / 2; i++)
        inv[i] = 1.0f / powf((float)g->rope_theta, (float)(2 * i) / (float)g->rot_dim);
    const cudaError_t e = cudaMemcpy(dst, inv, (size_t)(g->rot_dim / 2) * sizeof(float), cudaMemcpyHostToDevice);
    free(inv);
    return e;
}

static int cuda_state_init(dfl_target_state *s, const dfl_model *m, int max_ctx, int max_batch, int record) {
    memset(s, 0, sizeof *s);
    const dfl_config *g = &m->cfg;
    if (max_ctx < 1 || max_batch < 1 || max_batch > max_ctx)
        return dfl_seterr("state: invalid sizes (max context %d, max batch %d)", max_ctx, max_batch);
    cu_state *c = calloc(1, sizeof *c);
    if (!c) return dfl_seterr("out of memory");
    s->m = m, s->dev = c, s->max_ctx = max_ctx, s->max_batch = max_batch, s->record = record, s->rec_n = -1;
    const int L = g->n_layers, H = g->hidden, B = max_batch, C = m->conv_dim, Hv = g->lin_v_heads;
    const size_t kvw = (size_t)g->n_kv_heads * g->head_dim, win = (size_t)(g->conv_kernel - 1) * C;
    const size_t HS = (size_t)Hv * g->lin_k_dim * g->lin_v_dim;
    const size_t qw = (size_t)(2 * g->n_heads * g->head_dim > C ? 2 * g->n_heads * g->head_dim : C);
    const size_t aw =
        (size_t)(g->n_heads * g->head_dim > Hv * g->lin_v_dim ? g->n_heads * g->head_dim : Hv * g->lin_v_dim);
    cudaError_t e; /* declared before the first goto: the cleanup is reached from every allocation */
    float ***tabs[] = {&c->kc, &c->vc, &c->conv, &c->S, &c->conv0, &c->S0, &c->rqkv, &c->rab, &c->tconv, &c->tS};
    for (size_t i = 0; i < sizeof tabs / sizeof *tabs; i++)
        if (!(*tabs[i] = calloc((size_t)L, sizeof(float *)))) goto oom;
    for (int li = 0; li < L; li++) {
        if (is_full(g, li)) {
            DALLOC(c->kc[li], (size_t)max_ctx * kvw);
            DALLOC(c->vc[li], (size_t)max_ctx * kvw);
            continue;
        }
        DALLOC(c->conv[li], win);
        DALLOC(c->S[li], HS);
        if (record) {
            DALLOC(c->conv0[li], win);
            DALLOC(c->S0[li], HS);
            DALLOC(c->rqkv[li], (size_t)B * C);
            DALLOC(c->rab[li], (size_t)2 * B * Hv);
        }
    }
    DALLOC(c->x, (size_t)B * H);
    DALLOC(c->xn, (size_t)B * H);
    DALLOC(c->q, (size_t)B * qw);
    DALLOC(c->k, (size_t)B * kvw);
    DALLOC(c->v, (size_t)B * kvw);
    DALLOC(c->att, (size_t)B * aw);
    DALLOC(c->z, (size_t)B * Hv * g->lin_v_dim);
    DALLOC(c->a, (size_t)B * Hv);
    DALLOC(c->b, (size_t)B * Hv);
    DALLOC(c->mlp1, (size_t)B * g->intermediate);
    DALLOC(c->mlp2, (size_t)B * g->intermediate);
    DALLOC(c->logits, (size_t)B * g->vocab);
    DALLOC(c->scores, (size_t)B * g->n_heads * max_ctx);
    DALLOC(c->inv_freq, g->rot_dim / 2 + 1);
    DALLOC(c->tok, B);
    DALLOC(c->pos, B);
    DALLOC(c->ids, B);
    DALLOC(c->bad, 1);
    if ((e = upload_inv_freq(c->inv_freq, g)) == cudaErrorMemoryAllocation) goto oom;
    if (e != cudaSuccess) {
        cuda_state_free(s);
        return cu_fail(e, "inv_freq");
    }
    s->bytes = c->pool.bytes;
    cuda_state_reset(s);
    return DFL_OK;
oom:;
    const double gb = c->pool.bytes / 1e9;
    cuda_state_free(s);
    return dfl_seterr("out of GPU memory allocating the run state (%.2f GB allocated before the failure; context %d, "
                      "batch %d); lower --max-context",
                      gb, max_ctx, max_batch);
}

static void cuda_disable_tree(dfl_target_state *s) {
    cu_state *c = s->dev;
    if (!c) return;
    pool_free(&c->tree_pool);
    const int L = s->m->cfg.n_layers;
    for (int li = 0; li < L; li++) c->tconv[li] = c->tS[li] = NULL;
    free(c->h_anc), free(c->h_depth), free(c->h_par);
    c->h_anc = c->h_depth = c->h_par = NULL;
    c->anc = c->depth = c->par = NULL;
    s->tree_cap = s->tree_n = 0;
}

static void cuda_state_free(dfl_target_state *s) {
    cu_state *c = s->dev;
    if (c) {
        cuda_disable_tree(s);
        pool_free(&c->pool);
        free(c->kc), free(c->vc), free(c->conv), free(c->S), free(c->conv0), free(c->S0), free(c->rqkv), free(c->rab);
        free(c->tconv), free(c->tS);
        free(c);
    }
    memset(s, 0, sizeof *s);
}

static void cuda_state_reset(dfl_target_state *s) {
    cu_state *c = s->dev;
    const dfl_config *g = &s->m->cfg;
    const size_t win = (size_t)(g->conv_kernel - 1) * s->m->conv_dim;
    const size_t HS = (size_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim;
    for (int li = 0; li < g->n_layers; li++)
        if (!is_full(g, li)) {
            cudaMemset(c->conv[li], 0, win * sizeof(float));
            cudaMemset(c->S[li], 0, HS * sizeof(float));
        }
    s->n_past = 0;
    s->rec_n_past = 0, s->rec_n = -1;
    s->tree_n = 0;
}

static int cuda_enable_tree(dfl_target_state *s, int max_nodes) {
    cu_state *c = s->dev;
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    if (max_nodes < 1 || max_nodes > s->max_batch)
        return dfl_seterr("tree of %d nodes: must be in [1, %d] (the run state's batch)", max_nodes, s->max_batch);
    cuda_disable_tree(s);
    const size_t win = (size_t)(g->conv_kernel - 1) * m->conv_dim;
    const size_t HS = (size_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim;
    cu_pool *pl = &c->tree_pool;
    for (int li = 0; li < g->n_layers; li++)
        if (!is_full(g, li)) {
            c->tconv[li] = pool_alloc(pl, (size_t)max_nodes * win * sizeof(float));
            c->tS[li] = pool_alloc(pl, (size_t)max_nodes * HS * sizeof(float));
            if (!c->tconv[li] || !c->tS[li]) goto oom;
        }
    c->anc = pool_alloc(pl, (size_t)max_nodes * s->max_batch * sizeof(int));
    c->depth = pool_alloc(pl, (size_t)max_nodes * sizeof(int));
    c->par = pool_alloc(pl, (size_t)max_nodes * sizeof(int));
    c->h_anc = calloc((size_t)max_nodes * s->max_batch, sizeof(int));
    c->h_depth = calloc((size_t)max_nodes, sizeof(int));
    c->h_par = calloc((size_t)max_nodes, sizeof(int));
    if (!c->anc || !c->depth || !c->par || !c->h_anc || !c->h_depth || !c->h_par) goto oom;
    s->tree_cap = max_nodes;
    s->bytes = c->pool.bytes + pl->bytes;
    return DFL_OK;
oom:;
    const double gb = pl->bytes / 1e9;
    cuda_disable_tree(s);
    return dfl_seterr("out of GPU memory for tree verification states of %d nodes (%.2f GB allocated before the "
                      "failure); lower the tree budget",
                      max_nodes, gb);
}

/* ---- forward ------------------------------------------------------------------------------- */

static void attention_layer(dfl_target_state *s, int li, int n, int tree) {
    cu_state *c = s->dev;
    const dfl_config *g = &s->m->cfg;
    const cu_layer *l = &((cu_model *)s->m->dev)->L[li];
    const int H = g->hidden, hd = g->head_dim, Hq = g->n_heads, Hkv = g->n_kv_heads;
    const int gated = g->attn_gate, ldh = hd * (gated ? 2 : 1), ldq = Hq * ldh;
    OP(OP_NORM, cu_rmsnorm(c->xn, c->x, l->input_norm, n, H, g->rms_eps));
    OP(OP_MATMUL, cu_matmul(c->q, c->xn, &l->q, n));
    OP(OP_MATMUL, cu_matmul(c->k, c->xn, &l->k, n));
    OP(OP_MATMUL, cu_matmul(c->v, c->xn, &l->v, n));
    OP(OP_ATTN, cu_qk_norm_rope(c->q, ldq, ldh, Hq, c->k, c->v, Hkv, hd, g->rot_dim, l->q_norm, l->k_norm, g->rms_eps,
                                c->pos, c->inv_freq, c->kc[li], c->vc[li], s->n_past, n));
    OP(OP_ATTN, cu_attention(c->att, c->q, ldq, ldh, Hq, Hkv, hd, c->kc[li], c->vc[li], s->n_past, tree ? c->anc : NULL,
                             s->max_batch, tree ? c->depth : NULL, gated, c->scores, s->max_ctx, n));
    OP(OP_MATMUL, cu_matmul(c->xn, c->att, &l->o, n));
    OP(OP_NORM, cu_add(c->x, c->xn, (size_t)n * H));
}

/* Conv, normalisation and recurrence of linear layer li over n rows of qkv (pre-conv): a chain
 * from S0 (NULL: S) into S, or a tree (c->par) into the node tables. */
static void gdn_core(dfl_target_state *s, int li, float *qkv, const float *a, const float *b, int n, const float *S0,
                     float *out, int tree) {
    cu_state *c = s->dev;
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const cu_layer *l = &((cu_model *)m->dev)->L[li];
    const int C = m->conv_dim;
    OP(OP_CONV, cu_conv_silu(qkv, C, n, g->conv_kernel, l->conv_w, c->conv[li], tree ? c->par : NULL,
                             tree ? c->tconv[li] : NULL));
    OP(OP_CONV, cu_l2norm_qk(qkv, C, g->lin_k_heads, g->lin_k_dim, n));
    OP(OP_REC, cu_gdn(qkv, C, g->lin_k_heads, g->lin_v_heads, g->lin_k_dim, g->lin_v_dim, a, b, g->lin_v_heads,
                      l->neg_exp_A, l->dt_bias, c->S[li], S0, out, n, tree ? c->par : NULL, tree ? c->tS[li] : NULL));
}

static int linear_layer(dfl_target_state *s, int li, int n, int tree) {
    cu_state *c = s->dev;
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const cu_layer *l = &((cu_model *)m->dev)->L[li];
    const int H = g->hidden, Hv = g->lin_v_heads, dv = g->lin_v_dim, C = m->conv_dim;
    OP(OP_NORM, cu_rmsnorm(c->xn, c->x, l->input_norm, n, H, g->rms_eps));
    OP(OP_MATMUL, cu_matmul(c->q, c->xn, &l->qkv, n));
    OP(OP_MATMUL, cu_matmul(c->z, c->xn, &l->z, n));
    OP(OP_MATMUL, cu_matmul(c->a, c->xn, &l->a, n));
    OP(OP_MATMUL, cu_matmul(c->b, c->xn, &l->b, n));
    const float *S0 = NULL;
    if (s->rec_n > 0) { /* the rollback record: state before the forward (kept by a swap), inputs */
        const size_t win = (size_t)(g->conv_kernel - 1) * C;
        CK(cudaMemcpyAsync(c->conv0[li], c->conv[li], win * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        float *t = c->S0[li];
        c->S0[li] = c->S[li], c->S[li] = t;
        S0 = c->S0[li];
        CK(cudaMemcpyAsync(c->rqkv[li], c->q, (size_t)n * C * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        CK(cudaMemcpyAsync(c->rab[li], c->a, (size_t)n * Hv * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        CK(cudaMemcpyAsync(c->rab[li] + (size_t)s->max_batch * Hv, c->b, (size_t)n * Hv * sizeof(float),
                           cudaMemcpyDeviceToDevice, 0));
    }
    gdn_core(s, li, c->q, c->a, c->b, n, S0, c->att, tree);
    OP(OP_NORM, cu_gated_rmsnorm(c->z, c->att, l->gnorm, n * Hv, dv, g->rms_eps));
    OP(OP_MATMUL, cu_matmul(c->xn, c->z, &l->out, n));
    OP(OP_NORM, cu_add(c->x, c->xn, (size_t)n * H));
    return DFL_OK;
}

static void mlp(dfl_target_state *s, int li, int n) {
    cu_state *c = s->dev;
    const dfl_config *g = &s->m->cfg;
    const cu_layer *l = &((cu_model *)s->m->dev)->L[li];
    OP(OP_NORM, cu_rmsnorm(c->xn, c->x, l->post_norm, n, g->hidden, g->rms_eps));
    OP(OP_MATMUL, cu_matmul(c->mlp1, c->xn, &l->gate, n));
    OP(OP_MATMUL, cu_matmul(c->mlp2, c->xn, &l->up, n));
    OP(OP_NORM, cu_swiglu(c->mlp1, c->mlp2, (size_t)n * g->intermediate));
    OP(OP_MATMUL, cu_matmul(c->xn, c->mlp1, &l->down, n));
    OP(OP_NORM, cu_add(c->x, c->xn, (size_t)n * g->hidden));
}

/* The tree tables on the host (as the CPU backend), then the inputs to the device. */
static int forward_prepare(dfl_target_state *s, const int32_t *tokens, const int *parent, int n) {
    cu_state *c = s->dev; /* sizes, tokens and capture layers: checked by the model API */
    int32_t pos[n > 0 ? n : 1];
    if (parent) {
        const int B = s->max_batch;
        for (int i = 0; i < n; i++) {
            if (parent[i] >= i || (i > 0 && parent[i] < 0) || (i == 0 && parent[0] != -1)) {
                s->tree_n = 0;
                return dfl_seterr("tree node %d: parent %d (node 0 is the root with parent -1; parents precede "
                                  "children)",
                                  i, parent[i]);
            }
            const int d = i == 0 ? 0 : c->h_depth[parent[i]] + 1;
            c->h_depth[i] = d, c->h_par[i] = parent[i];
            if (i > 0) memcpy(c->h_anc + (size_t)i * B, c->h_anc + (size_t)parent[i] * B, (size_t)d * sizeof(int));
            c->h_anc[(size_t)i * B + d] = i; /* the node's path by depth, itself last */
            pos[i] = s->n_past + d;
        }
        CK(cudaMemcpy(c->anc, c->h_anc, (size_t)n * B * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c->depth, c->h_depth, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(c->par, c->h_par, (size_t)n * sizeof(int), cudaMemcpyHostToDevice));
    } else {
        for (int t = 0; t < n; t++) pos[t] = s->n_past + t;
    }
    CK(cudaMemcpy(c->tok, tokens, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(c->pos, pos, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    return DFL_OK;
}

/* Logits of the last `rows` tokens on the device; their argmax and non-finite count; what the
 * caller asked for to the host. */
static int forward_logits(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, const dfl_fwd_out *o) {
    cu_state *c = s->dev;
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const cu_model *d = m->dev;
    const int H = g->hidden, V = g->vocab, rows = o->last_only && !parent ? 1 : n, first = n - rows;
    OP(OP_LOGITS, cu_rmsnorm(c->xn, c->x + (size_t)first * H, d->final_norm, rows, H, g->rms_eps));
    OP(OP_LOGITS, cu_matmul(c->logits, c->xn, &d->lm_head, rows));
    CK(cudaMemsetAsync(c->bad, 0, sizeof(unsigned), 0));
    OP(OP_LOGITS, cu_argmax(c->ids, c->logits, rows, V, c->bad));
    CK(cudaGetLastError());
    unsigned bad = 0;
    CK(cudaMemcpy(&bad, c->bad, sizeof bad, cudaMemcpyDeviceToHost));
    if (bad) { /* name the first bad row as the CPU backend does */
        float *row = malloc((size_t)V * sizeof(float));
        if (!row) return dfl_seterr("target logits are not finite (%u values)", bad);
        for (int r = 0; r < rows; r++) {
            CK(cudaMemcpy(row, c->logits + (size_t)r * V, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost));
            int nb = 0, nan = 0;
            for (int i = 0; i < V; i++)
                if (!isfinite(row[i])) nb++, nan += isnan(row[i]) != 0;
            if (nb) {
                free(row);
                const int t = first + r, pos = s->n_past - n + (parent ? c->h_depth[t] : t);
                return dfl_seterr("target logits are not finite at position %d (token %d; %d of %d values: %d NaN, "
                                  "%d Inf): the checkpoint holds NaN/Inf weights or overflows; run dfl inspect "
                                  "--check-weights %s",
                                  pos, tokens[t], nb, V, nan, nb - nan, m->dir ? m->dir : "DIR");
            }
        }
        free(row);
    }
    if (o->logits && !o->logits_scratch)
        CK(cudaMemcpy(o->logits, c->logits, (size_t)rows * V * sizeof(float), cudaMemcpyDeviceToHost));
    if (o->argmax) CK(cudaMemcpy(o->argmax, c->ids, (size_t)rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return DFL_OK;
}

static int cuda_forward(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, const dfl_fwd_out *o) {
    cu_state *c = s->dev;
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    const int H = g->hidden, tree = parent != NULL, base = s->n_past;
    if (forward_prepare(s, tokens, parent, n) != DFL_OK) return DFL_ERR;
    OP(OP_NORM, cu_embed(c->x, &((cu_model *)m->dev)->embed, c->tok, n));
    s->moe_touched = 0;
    s->rec_n_past = s->n_past;
    s->rec_n = s->record && !s->no_record && !tree ? n : -1;
    for (int li = 0; li < g->n_layers; li++) {
        if (is_full(g, li)) attention_layer(s, li, n, tree);
        else if (linear_layer(s, li, n, tree) != DFL_OK) return DFL_ERR;
        mlp(s, li, n);
        if (o->cap) /* into the host rows, or into a feature handle's rows on the device */
            for (int k = 0; k < o->cap->n_layers; k++)
                if (o->cap->layers[k] == li) {
                    float *dst = o->cap->to ? (float *)o->cap->to->dev : o->cap->out;
                    CK(cudaMemcpy2D(dst + (size_t)k * H, (size_t)o->cap->n_layers * H * sizeof(float), c->x,
                                    (size_t)H * sizeof(float), (size_t)H * sizeof(float), (size_t)n,
                                    o->cap->to ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost));
                }
    }
    CK(cudaGetLastError());
    s->n_past += n;
    if (tree) s->tree_base = base, s->tree_n = n;
    if (o->logits || o->argmax) {
        if (forward_logits(s, tokens, parent, n, o) != DFL_OK) {
            if (tree) s->tree_n = 0;
            return DFL_ERR;
        }
    } else {
        CK(cudaDeviceSynchronize());
    }
    return DFL_OK;
}

static int cuda_rollback(dfl_target_state *s, int keep) {
    cu_state *c = s->dev;
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    /* keep is checked by the model API: inside the recorded forward, not n_past */
    const int n_keep = keep - s->rec_n_past, C = m->conv_dim, Hv = g->lin_v_heads;
    const size_t win = (size_t)(g->conv_kernel - 1) * C, HS = (size_t)Hv * g->lin_k_dim * g->lin_v_dim;
    for (int li = 0; li < g->n_layers; li++) {
        if (is_full(g, li)) continue;
        CK(cudaMemcpyAsync(c->conv[li], c->conv0[li], win * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        if (n_keep > 0) { /* replay the recorded inputs from the state before the forward */
            CK(cudaMemcpyAsync(c->q, c->rqkv[li], (size_t)n_keep * C * sizeof(float), cudaMemcpyDeviceToDevice, 0));
            gdn_core(s, li, c->q, c->rab[li], c->rab[li] + (size_t)s->max_batch * Hv, n_keep, c->S0[li], NULL, 0);
        } else {
            CK(cudaMemcpyAsync(c->S[li], c->S0[li], HS * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        }
    }
    CK(cudaGetLastError());
    s->n_past = keep;
    s->rec_n = n_keep;
    return DFL_OK;
}

static int cuda_tree_commit(dfl_target_state *s, const int *path, int len) {
    cu_state *c = s->dev;
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    if (s->tree_n == 0 || len < 1 || len > s->tree_n || path[0] != 0)
        return dfl_seterr("tree commit: a path of %d nodes must start at the root of the last tree forward", len);
    for (int k = 1; k < len; k++)
        if (path[k] <= path[k - 1] || path[k] >= s->tree_n || c->h_par[path[k]] != path[k - 1])
            return dfl_seterr("tree commit: node %d at step %d is not a child of node %d", path[k], k, path[k - 1]);
    const size_t kvw = (size_t)g->n_kv_heads * g->head_dim, win = (size_t)(g->conv_kernel - 1) * m->conv_dim;
    const size_t HS = (size_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim;
    const int base = s->tree_base, last = path[len - 1];
    for (int li = 0; li < g->n_layers; li++) {
        if (is_full(g, li)) { /* the path's K/V to consecutive rows; path[k] >= k, read before written */
            for (int k = 1; k < len; k++) {
                if (path[k] == k) continue;
                CK(cudaMemcpyAsync(c->kc[li] + (size_t)(base + k) * kvw, c->kc[li] + (size_t)(base + path[k]) * kvw,
                                   kvw * sizeof(float), cudaMemcpyDeviceToDevice, 0));
                CK(cudaMemcpyAsync(c->vc[li] + (size_t)(base + k) * kvw, c->vc[li] + (size_t)(base + path[k]) * kvw,
                                   kvw * sizeof(float), cudaMemcpyDeviceToDevice, 0));
            }
        } else {
            CK(cudaMemcpyAsync(c->conv[li], c->tconv[li] + (size_t)last * win, win * sizeof(float),
                               cudaMemcpyDeviceToDevice, 0));
            CK(cudaMemcpyAsync(c->S[li], c->tS[li] + (size_t)last * HS, HS * sizeof(float), cudaMemcpyDeviceToDevice,
                               0));
        }
    }
    s->n_past = base + len;
    s->tree_n = 0;
    return DFL_OK;
}

#define PROBE_PASSES 7

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* A streaming read kernel over a device buffer of `bytes`: one warm-up, then PROBE_PASSES timed
 * passes (CUDA events). */
static int cuda_probe(uint64_t bytes, double *median, double *best) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    void *buf = NULL, *out = NULL;
    bytes &= ~(uint64_t)15;
    CK(cudaMalloc(&buf, bytes));
    if (cudaMalloc(&out, (size_t)sms * 8 * sizeof(float)) != cudaSuccess) {
        cudaFree(buf);
        return dfl_seterr("out of GPU memory for the probe");
    }
    cudaMemset(buf, 0, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float ms[PROBE_PASSES];
    cu_read_probe(buf, bytes / 16, out);
    for (int r = 0; r < PROBE_PASSES; r++) {
        cudaEventRecord(e0, 0);
        cu_read_probe(buf, bytes / 16, out);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[r], e0, e1);
    }
    const cudaError_t e = cudaGetLastError();
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(buf), cudaFree(out);
    if (e != cudaSuccess) return cu_fail(e, "bandwidth probe");
    qsort(ms, PROBE_PASSES, sizeof(float), cmp_f);
    *median = bytes / (ms[PROBE_PASSES / 2] * 1e-3) / 1e9;
    *best = bytes / (ms[0] * 1e-3) / 1e9;
    return DFL_OK;
}

static void cuda_describe(char *buf, int len) {
    struct cudaDeviceProp p;
    int drv = 0, rt = 0;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(buf, (size_t)len, "cuda (no device)");
        return;
    }
    cudaDriverGetVersion(&drv), cudaRuntimeGetVersion(&rt);
    snprintf(buf, (size_t)len, "%s, %.1f GiB, %d SMs, sm_%d%d, driver %d.%d, runtime %d.%d", p.name,
             p.totalGlobalMem / 1073741824.0, p.multiProcessorCount, p.major, p.minor, drv / 1000, drv % 1000 / 10,
             rt / 1000, rt % 1000 / 10);
}

/* ---- feature rows on the device (dfl_feat) --------------------------------------------------- */

static int cuda_feat_alloc(dfl_feat *f) {
    const size_t bytes = (size_t)f->rows * f->width * sizeof(float);
    if (cudaMalloc(&f->dev, bytes) != cudaSuccess) {
        cudaGetLastError();
        f->dev = NULL;
        return dfl_seterr("out of GPU memory for %d x %d feature rows (%.1f MB)", f->rows, f->width, bytes / 1e6);
    }
    return DFL_OK;
}

static void cuda_feat_free(dfl_feat *f) { cudaFree(f->dev); }

/* An accepted path's rows to the front, on the device: rows idx[k] >= k ascending, so no source is
 * an earlier destination (checked by dfl_feat_gather). */
static int cuda_feat_gather(dfl_feat *f, const int *idx, int n) {
    const size_t w = (size_t)f->width;
    float *d = f->dev;
    for (int k = 0; k < n; k++)
        if (idx[k] != k) CK(cudaMemcpyAsync(d + k * w, d + idx[k] * w, w * sizeof(float), cudaMemcpyDeviceToDevice, 0));
    return DFL_OK;
}

static int cuda_feat_read(const dfl_feat *f, int row0, int n, float *dst) {
    CK(cudaMemcpy(dst, (const float *)f->dev + (size_t)row0 * f->width, (size_t)n * f->width * sizeof(float),
                  cudaMemcpyDeviceToHost));
    return DFL_OK;
}

const dfl_backend dfl_backend_cuda = {
    .name = "cuda",
    .model_upload = cuda_model_upload,
    .model_release = cuda_model_release,
    .target_state_init = cuda_state_init,
    .target_state_free = cuda_state_free,
    .target_state_reset = cuda_state_reset,
    .forward = cuda_forward,
    .rollback = cuda_rollback,
    .enable_tree = cuda_enable_tree,
    .disable_tree = cuda_disable_tree,
    .tree_commit = cuda_tree_commit,
    .probe = cuda_probe,
    .describe = cuda_describe,
    .feat_alloc = cuda_feat_alloc,
    .feat_free = cuda_feat_free,
    .feat_gather = cuda_feat_gather,
    .feat_read = cuda_feat_read,
};
