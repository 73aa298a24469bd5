/* Target models: Qwen3 dense and Qwen3.5/3.6 hybrid (Gated DeltaNet + gated attention), each
 * with a dense MLP or a sparse mixture of experts per layer (qwen3_moe, qwen3_5_moe).
 * Weights stay in the safetensors mmap; run state (caches, scratch) is allocated once. */
#ifndef DFL_MODEL_H
#define DFL_MODEL_H

#include <stdint.h>

#include "dfl/backend.h"
#include "dfl/config.h"
#include "dfl/kernels.h"
#include "dfl/quant.h"
#include "dfl/safetensors.h"

typedef enum dfl_layout {
    DFL_LAYOUT_TEXT,    /* text-only export: model.layers.* */
    DFL_LAYOUT_VLM,     /* vision-language checkpoint: text under model.language_model.* */
    DFL_LAYOUT_DRAFTER, /* DFlash drafter: fc, hidden_norm, layers.* */
} dfl_layout;

/* Tensor components of a checkpoint, for the anatomy report. */
typedef enum dfl_component {
    DFL_COMP_TEXT,
    DFL_COMP_VISION,
    DFL_COMP_MTP,
    DFL_COMP_OTHER,
    DFL_COMP_COUNT
} dfl_component;

typedef struct dfl_layer_w {
    dfl_layer_type type;
    float *input_norm; /* [H] effective multiplier (Qwen3.5: 1 + w) */
    float *post_norm;  /* [H] */
    /* full attention */
    dfl_mat q_proj; /* [Hq*hd, H], Qwen3.5: [Hq*hd*2, H] = per head [query | gate] */
    dfl_mat k_proj; /* [Hkv*hd, H] */
    dfl_mat v_proj; /* [Hkv*hd, H] */
    dfl_mat o_proj; /* [H, Hq*hd] */
    float *q_norm;  /* [hd] */
    float *k_norm;  /* [hd] */
    /* linear attention (Gated DeltaNet) */
    dfl_mat in_qkv;   /* [2*Hk*dk + Hv*dv, H] */
    dfl_mat in_z;     /* [Hv*dv, H] */
    dfl_mat in_b;     /* [Hv, H] */
    dfl_mat in_a;     /* [Hv, H] */
    dfl_mat out_proj; /* [H, Hv*dv] */
    float *conv_w;    /* [conv_dim, K] */
    float *neg_exp_A; /* [Hv] = -exp(A_log) */
    float *dt_bias;   /* [Hv] */
    float *gnorm;     /* [dv] plain multiplier of the gated RMSNorm */
    /* dense MLP (moe == 0) */
    dfl_mat gate, up; /* [I, H] */
    dfl_mat down;     /* [H, I] */
    /* sparse MoE block (moe == 1); E experts of inner size Ie, shared expert of inner size Is */
    int moe;
    dfl_mat router;         /* [E, H] mlp.gate */
    dfl_mat *exp_gate;      /* [E] each [Ie, H]: views into the per-expert tensors or the fused
                             * gate_up_proj [E, 2*Ie, H] (rows 0..Ie-1 of expert e) */
    dfl_mat *exp_up;        /* [E] each [Ie, H] (fused: rows Ie..2*Ie-1) */
    dfl_mat *exp_down;      /* [E] each [H, Ie] (fused: down_proj [E, H, Ie]) */
    void *exp_owned;        /* private aligned copy of fused expert tensors stored unaligned */
    int exp_fused;          /* 1: the checkpoint stores the experts fused (gate_up_proj / down_proj) */
    dfl_mat sh_gate, sh_up; /* [Is, H] shared expert */
    dfl_mat sh_down;        /* [H, Is] */
    dfl_mat sh_score;       /* [1, H] shared_expert_gate: the shared expert's output is scaled by
                             * sigmoid(sh_score . x) */
} dfl_layer_w;

typedef struct dfl_model {
    dfl_config cfg;
    dfl_quant quant; /* config.json's quantization_config (fine-grained FP8), if any */
    st_checkpoint st;
    char *dir;
    dfl_layout layout;
    const char *prefix;       /* text tensor prefix that matched, e.g. "model.language_model." */
    dfl_mat embed;            /* [V, H] */
    dfl_mat lm_head;          /* [V, H]; shares embed's data when tied */
    kn_row_norms *head_norms; /* lm_head's row norms (greedy verification, kn_matmul_argmax) */
    float *final_norm;        /* [H] */
    dfl_layer_w *layers;      /* [L] */
    unsigned char *used;      /* [n_tensors] 1 if the forward reads the tensor */
    int comp_count[DFL_COMP_COUNT];
    uint64_t comp_bytes[DFL_COMP_COUNT];
    uint64_t weight_bytes;    /* bytes of tensors the forward reads */
    int eos_ids[DFL_MAX_EOS]; /* config + generation_config.json + tokenizer_config.json */
    int n_eos;
    int conv_dim;           /* 2*Hk*dk + Hv*dv */
    uint64_t expert_params; /* parameters of one routed expert summed over the sparse layers
                             * (3 * H * Ie per layer): total - (E - k) * this = active */
    dfl_device device;      /* where the forward runs (model_use_device; DFL_DEVICE_CPU at open) */
    const dfl_backend *be;  /* that device's backend */
    void *dev;              /* the backend's copy of the weights (NULL on the CPU) */
} dfl_model;

/* Known text-layer prefixes, tried in order; exactly one must match. */
extern const char *const dfl_text_prefixes[];

/* model_open's flags. */
enum {
    DFL_OPEN_CHECK_WEIGHTS = 1, /* scan every used tensor for NaN/Inf (slow on big models) */
    DFL_OPEN_HEAD_ONLY = 2,     /* only the embedding and lm_head will run (a replay on saved
                                 * features): the layers stay mapped whatever the placement */
    DFL_OPEN_FOR_DEVICE = 4     /* the model moves to a device (model_use_device): auto maps, as
                                 * a host copy would only hold memory */
};
/* Open a target checkpoint directory: config, tensors, layout, shape checks; the weights mapped
 * or copied as st_place_decide says (m->st.place_why). The model computes on the CPU until
 * model_use_device moves it. */
int model_open(dfl_model *m, const char *dir, int flags);
void model_close(dfl_model *m);
/* Run the model's forwards on device d from now on (dfl/backend.h): uploads the weights once.
 * DFL_ERR, naming what is missing or unsupported, when the device cannot run this model; the
 * model then stays on its device. Call before any target_state_init. The host copy stays mapped (the
 * drafters' embedding and lm_head, the anatomy report). */
int model_use_device(dfl_model *m, dfl_device d);
/* Component of a tensor name given the matched layout (for the anatomy report). */
dfl_component model_component(const dfl_model *m, const char *name);
const char *model_component_name(dfl_component c);
const char *model_layout_name(dfl_layout l);

/* Hidden-state capture: layer k = output of decoder layer k (transformers' hidden_states[k+1]). */
typedef struct dfl_capture {
    int n_layers;
    const int *layers; /* decoder layer ids */
    float *out;        /* [n_tokens][n_layers][H] on the host; rows written at out + t*n_layers*H */
    dfl_feat *to;      /* or (out NULL) rows 0..n_tokens-1 of a handle on the model's device, the
                        * same layout (width n_layers*H): captured rows stay where the backend is */
} dfl_capture;

/* Scratch of a sparse MoE block over up to B tokens (k = experts per token); the target's forward
 * and the MTP head's layer each hold one. */
typedef struct dfl_moe_buf {
    float *logits;   /* [B, E] router logits, then probabilities */
    int *idx;        /* [B, k] experts of each token, ascending expert id */
    float *w;        /* [B, k] their routing weights */
    int *rows;       /* [B * k] (token * k + slot) of each expert-sorted row */
    int *count;      /* [2E + 1] rows per expert, then prefix offsets; fill cursors */
    float *x;        /* [B * k, H] inputs gathered by expert */
    float *y;        /* [B * k, H] expert outputs, same order */
    float *sh;       /* [B] shared-expert gate logits */
    float *sy;       /* [B, H] shared-expert outputs (with a shared expert) */
    kn_mm_job *jobs; /* [2E + 2] the products of one parallel region */
} dfl_moe_buf;

/* Run state of one sequence. */
typedef struct dfl_target_state {
    const dfl_model *m;
    int max_ctx;        /* positions the caches hold */
    int max_batch;      /* tokens per forward call */
    int n_past;         /* committed positions in the caches */
    float **k_cache;    /* [L] full layers: [max_ctx, Hkv*hd] (NULL for linear layers) */
    float **v_cache;    /* [L] */
    float **conv_state; /* [L] linear layers: [K-1, conv_dim], oldest first */
    float **rec_state;  /* [L] linear layers: [Hv, dk, dv] */
    /* Rollback record of the last forward (when `record`): each linear layer's state before it,
     * and its per-token recurrence inputs, so that the state after any prefix of the batch is
     * recomputed exactly (same code path) without snapshotting a state per token. */
    int record;        /* the record buffers exist (target_state_init's record) */
    int no_record;     /* set by the caller: the next forwards are never rolled back
                        * (prefill, plain decode steps), so skip the record copies */
    int rec_n_past;    /* n_past before the recorded forward */
    int rec_n;         /* tokens in the recorded forward; -1: the last forward kept no record */
    float **rec_conv0; /* [L] [K-1, conv_dim] conv window before the forward */
    float **rec_S0;    /* [L] [Hv, dk, dv] recurrent state before the forward */
    float **rec_qkv;   /* [L] [max_batch, conv_dim] pre-conv projections */
    float **rec_ab;    /* [L] [max_batch, 2*Hv] raw a | b projections */
    /* tree verification (target_state_enable_tree): per-node linear-attention states */
    int tree_cap;            /* max nodes per tree forward (0 = tree verification off) */
    const int *tree_parent;  /* during a tree forward: [n] parent node, -1 for the root */
    int *tree_depth;         /* [tree_cap] depth of each node of the last tree forward */
    unsigned char *tree_anc; /* [tree_cap, max_batch] 1 where node j is node i or its ancestor */
    /* No node's recurrent state outlives the forward (each thread keeps the states of one
     * root-to-node path, in depth-first order, in tree_stack); target_state_tree_commit
     * recomputes the committed path's from these inputs: */
    float **tree_xin;  /* [L] linear layers: [tree_cap, conv_dim] each node's conv input */
    float **tree_qkv;  /* [L] linear layers: [tree_cap, conv_dim] each node's conv output
                        * (q, k normalised): the recurrence's input */
    float **tree_ab;   /* [L] linear layers: [tree_cap, 2*Hv] each node's raw a | b */
    int *tree_par;     /* [tree_cap] parent of each node of the last tree forward */
    int *tree_order;   /* [tree_cap] the nodes of the last tree forward in depth-first preorder */
    int *tree_link;    /* [2, tree_cap] each node's first child and next sibling (-1: none) */
    float *tree_stack; /* [tree_threads, tree_levels, dk, dv] per thread, a state per depth */
    int tree_threads;  /* threads tree_stack has room for */
    int tree_levels;   /* depths tree_stack has room for (grown by a deeper tree's forward) */
    int tree_base;     /* n_past before the last tree forward */
    int tree_n;        /* nodes of the last tree forward (0 once committed) */
    /* scratch, sized for max_batch tokens */
    float *x;           /* [B, H] residual stream */
    float *xn;          /* [B, H] */
    float *q;           /* [B, max(Hq*hd*2, conv_dim)] */
    float *k;           /* [B, Hkv*hd] */
    float *v;           /* [B, Hkv*hd] */
    float *att;         /* [B, max(Hq*hd, Hv*dv)] */
    float *z;           /* [B, Hv*dv] */
    float *ab;          /* [B, 2*Hv] */
    float *mlp1, *mlp2; /* [B * max(I, k*Ie, Is)] dense MLP / expert / shared expert inner rows */
    dfl_moe_buf moe;    /* MoE scratch for B tokens (n_experts > 0) */
    /* distinct experts the last forward touched, summed over the sparse layers (the weights a
     * forward streams: verification of n tokens reads up to n*k experts per layer) */
    long moe_touched;
    float *scores;              /* [threads, max_ctx] */
    float *rope_cos, *rope_sin; /* [B, rot/2] */
    float *inv_freq;            /* [rot/2] */
    uint64_t bytes;             /* memory held by this state (device memory on a GPU backend) */
    void *dev;                  /* a device backend's state (caches and scratch there); the host
                                 * buffers above stay NULL then */
} dfl_target_state;

/* Bytes a state of this size would hold (for the footprint check and report). */
uint64_t target_state_bytes(const dfl_model *m, int max_ctx, int max_batch, int record);
/* Allocate; fails before allocating when the footprint exceeds available memory.
 * record: keep what target_state_rollback() needs (speculative decoding). */
int target_state_init(dfl_target_state *s, const dfl_model *m, int max_ctx, int max_batch, int record);
void target_state_free(dfl_target_state *s);
void target_state_reset(dfl_target_state *s);

/* Forward n tokens at positions n_past.. on top of the cache (prefill, decode and verification
 * are the same call). logits: [n, V] or NULL; logits_last_only: only the last row is computed
 * (written at logits[0]). cap: optional capture. Advances n_past by n. */
int model_forward(dfl_target_state *s, const int32_t *tokens, int n, float *logits, int logits_last_only,
                  const dfl_capture *cap);
/* The same forward (parent NULL) or tree forward (parent: as model_forward_tree) asking for what
 * the caller needs back (dfl_fwd_out: logits, argmax ids, capture): on a device backend only that
 * crosses to the host. */
int model_forward_ex(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, const dfl_fwd_out *out);

/* Roll back to n_past = keep, with keep inside the last forward's range (needs record=1 and a
 * recorded last forward: not a tree forward, not one run with no_record).
 * Attention KV is truncated; each linear layer's conv window and recurrent state are restored
 * to their values right after token keep-1, by replaying the recorded recurrence inputs from
 * the state before the forward. */
int target_state_rollback(dfl_target_state *s, int keep);

/* What the two rollback strategies of a hybrid model copy per round of B tokens, timed on the live
 * CPU state (dfl bench): replay (what dfl does) records each linear layer's recurrent state and
 * conv window before a forward plus B tokens of recurrence inputs; snapshots (the alternative)
 * would copy state and window after each of the B tokens and one back on rollback. The best of
 * reps after a warm-up; sizes in MB. DFL_ERR on a device backend. */
typedef struct dfl_rollback_costs {
    double record_ms, snap_save_ms, snap_restore_ms;
    double record_mb, snap_mb;
} dfl_rollback_costs;
int target_state_rollback_costs(dfl_target_state *s, int B, int reps, dfl_rollback_costs *c);

/* Tree verification (DDTree, docs/design.md §6). Enable per-node states for trees of up to max_nodes
 * nodes (root included); memory: per linear layer max_nodes x (conv window + [Hv, dk, dv]). */
int target_state_enable_tree(dfl_target_state *s, int max_nodes);
void target_state_disable_tree(dfl_target_state *s);
/* One forward over a tree of n nodes on top of the committed context: node 0 is the root
 * (parent -1), parent[i] < i. Node i sits at position n_past + depth(i) and attends to the
 * committed context, its ancestors and itself; in linear layers its conv window and recurrent
 * state continue its parent's. logits [n, V] (or NULL); cap rows are per node. */
int model_forward_tree(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, float *logits,
                       const dfl_capture *cap);
/* Commit the root path path[0..len-1] (path[0] = 0, path[k] a depth-k node): its K/V are
 * compacted to consecutive positions, the linear layers take the last node's state. */
int target_state_tree_commit(dfl_target_state *s, const int *path, int len);

/* Embedding row of a token: out[H]. */
void model_embed(const dfl_model *m, int32_t token, float *out);
/* logits[V] = lm_head . x (x already final-normed). */
void model_lm_head(const dfl_model *m, const float *x, float *logits, int n);
/* ids[n] = each row's argmax of model_lm_head, logits [n, V] then scratch; returns 1 where the
 * logits hold every row (check them), 0 where kn_matmul_argmax found the ids without them. */
int model_lm_head_argmax(const dfl_model *m, const float *x, float *logits, int32_t *ids, int n);

/* Sparse MoE blocks (docs/moe.md), shared by the target's layers and the MTP head's layer.
 * moe_buf_init: scratch for up to rows tokens of config g (adds its bytes to *bytes, or NULL). */
int moe_buf_init(dfl_moe_buf *b, const dfl_config *g, int rows, uint64_t *bytes);
void moe_buf_free(dfl_moe_buf *b);
/* Inner rows per token the block needs in mlp1 / mlp2: k * Ie + Is (the routed experts' rows,
 * then the shared expert's). */
size_t moe_inner_per_token(const dfl_config *g);
/* The MoE block l of config g on xn [n, H] (already post-attention-normed), added into the
 * residual x [n, H]; mlp1 / mlp2 [n * moe_inner_per_token] scratch. Returns the distinct experts
 * the n tokens touched. A token's output does not depend on the other tokens of the call. */
int moe_forward(const dfl_config *g, const dfl_layer_w *l, dfl_moe_buf *b, const float *xn, float *x, float *mlp1,
                float *mlp2, int n);

#endif
