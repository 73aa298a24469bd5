/* Internal: tensor binding helpers used by the target, drafter and MTP loaders (loader.c; the MoE
 * block: loader_moe.c). */
#ifndef DFL_MODELS_LOADER_H
#define DFL_MODELS_LOADER_H

#include "dfl/kernels.h"
#include "dfl/model.h"
#include "dfl/quant.h"
#include "dfl/safetensors.h"

typedef struct ld_ctx {
    st_checkpoint *st;
    const char *where;      /* checkpoint directory, for messages */
    unsigned char *used;    /* [n_tensors] marks, or NULL */
    int check_weights;      /* scan for NaN/Inf (every bound tensor; reported together by ld_finish) */
    const dfl_quant *quant; /* the checkpoint's quantization_config (NULL: F8 weights refused) */
    int place;              /* matrices copied into the checkpoint's arena (st_place_decide) */
    /* where the next tensor's expected shape comes from ("vocab_size 1024, hidden_size 64"),
     * named in its shape / missing message; set with ld_why, cleared by every bind */
    char why[256];
    int layer, n_layers; /* the decoder layer being bound (-1: none), for missing tensors */
    /* --check-weights findings */
    int n_bad;
    size_t bad_len;
    char bad[3072];
} ld_ctx;

/* Set the config fields the next bound tensor's shape comes from (printf format). */
void ld_why(ld_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Find a tensor with exactly this shape and a supported dtype; marks it used. NULL + error. */
const st_tensor *ld_tensor(ld_ctx *c, const char *name, int nd, const int64_t *shape);
/* Where a bound tensor's bytes are read: its copy in the arena when c->place, else the mapping
 * (NULL + error when the copy fails). */
const uint8_t *ld_data(ld_ctx *c, const st_tensor *t);
/* Bind a [rows, cols] matrix (zero-copy when element-aligned and mapped). An F8_E4M3 weight `<m>.weight`
 * takes its block scales from `<m>.weight_scale_inv` [ceil(rows / brow), ceil(cols / bcol)]
 * (F32, F16 or BF16, converted to float32), given a quantization_config that does not list <m>
 * in modules_to_not_convert. */
int ld_mat(ld_ctx *c, const char *name, int rows, int cols, dfl_mat *out);
/* Read a small tensor as float32 (malloc'd), adding `add` to every element. */
float *ld_vec(ld_ctx *c, const char *name, int nd, const int64_t *shape, float add);
float *ld_vec1(ld_ctx *c, const char *name, int n, float add);
void ld_mat_free(dfl_mat *m);
/* A Qwen3-style attention block under `pre` ("<prefix>layers.<i>."), shapes from the config:
 * q_proj [n_heads*hd (x2 when gated: query and output gate), H], k_proj / v_proj [n_kv*hd, H],
 * o_proj [H, n_heads*hd], q_norm / k_norm [hd] (+ norm_add). */
typedef struct ld_attn {
    dfl_mat *q, *k, *v, *o;
    float **q_norm, **k_norm;
} ld_attn;
/* A SwiGLU MLP under `pre`: gate_proj / up_proj [I, H], down_proj [H, I]. */
int ld_mlp(ld_ctx *c, const char *pre, int H, int I, dfl_mat *gate, dfl_mat *up, dfl_mat *down);
int ld_attention(ld_ctx *c, const char *pre, int H, int n_heads, int n_kv, int hd, int gated, float norm_add,
                 ld_attn out);
/* A sparse MoE block under `pre` ("<prefix>layers.<i>.") of config g: router mlp.gate [E, H],
 * the routed experts per expert or fused, the gated shared expert when g has one. Sets l->moe. */
int ld_moe(ld_ctx *c, const dfl_config *g, dfl_layer_w *l, const char *pre);
/* Free what binding a layer allocated (n_experts: the config's E); zeroes l. */
void ld_layer_free(dfl_layer_w *l, int n_experts);
/* After binding everything: DFL_ERR naming every tensor the weight check found NaN/Inf in. */
int ld_finish(ld_ctx *c);

#endif
