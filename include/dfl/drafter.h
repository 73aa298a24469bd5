/* DFlash block drafter (z-lab format, docs/design.md §4): Qwen3 layers over [context ; block] keys,
 * the target's embedding and lm_head. A DFlash2 drafter (docs/dflash2.md) adds a grouped
 * depthwise convolution around each attention and MLP and a candidate selector that turns the
 * per-position logits into one coherent block. */
#ifndef DFL_DRAFTER_H
#define DFL_DRAFTER_H

#include <stdio.h>

#include "dfl/config.h"
#include "dfl/kernels.h"
#include "dfl/model.h"
#include "dfl/safetensors.h"

typedef struct dfl_dlayer_w {
    dfl_layer_type type;    /* DFL_LAYER_FULL (bidirectional in the block) or DFL_LAYER_SLIDING */
    float *input_norm;      /* [H] */
    float *post_norm;       /* [H] */
    dfl_mat q_proj;         /* [Hq*hd, H] */
    dfl_mat k_proj;         /* [Hkv*hd, H] */
    dfl_mat v_proj;         /* [Hkv*hd, H] */
    dfl_mat o_proj;         /* [H, Hq*hd] */
    float *q_norm, *k_norm; /* [hd] */
    dfl_mat gate, up;       /* [I, H] */
    dfl_mat down;           /* [H, I] */
    /* DFlash2 (NULL / unbound for DFlash), G = H / conv_group_size groups, T = conv_kernel_size:
     * side 0 convolves a sublayer's input, side 1 its output */
    float *attn_conv_base;  /* [2, T, H] attention_conv.base_kernel */
    dfl_mat attn_conv_proj; /* [2*T*G, H] attention_conv.kernel_projection: per-row deltas [2][T][G] */
    float *mlp_conv_base;   /* [2, T, H] mlp_conv.base_kernel */
    dfl_mat mlp_conv_proj;  /* [2*T*G, H] mlp_conv.kernel_projection */
} dfl_dlayer_w;

typedef struct dfl_drafter {
    dfl_config cfg; /* cfg.target_layer_ids resolved (default formula applied if needed) */
    st_checkpoint st;
    char *dir;
    const char *prefix;   /* "" or "model." */
    dfl_mat fc;           /* [H, n_feat*H] */
    float *hidden_norm;   /* [H] */
    float *norm;          /* [H] final norm */
    dfl_dlayer_w *layers; /* [L_d] */
    /* DFlash2 candidate selector (unbound for DFlash), R = selector_rank */
    dfl_mat sel_proj;    /* [R, H] candidate_selector.hidden_projection */
    dfl_mat sel_pred;    /* [V, R] candidate_selector.predecessor_codebook */
    dfl_mat sel_succ;    /* [V, R] candidate_selector.successor_codebook */
    unsigned char *used; /* [n_tensors] */
    uint64_t weight_bytes;
    /* block attention: cfg.causal is the setting in effect (drafter_set_causal may replace it) */
    int causal_config;   /* the config's cfg.causal */
    int causal_override; /* 1: cfg.causal was set by drafter_set_causal */
    char attn_desc[320]; /* drafter_attn_semantics */
} dfl_drafter;

/* Open a drafter checkpoint. n_target_layers resolves the default target_layer_ids when the
 * config has neither target_layer_ids nor num_target_layers (pass 0 when unknown). */
int drafter_open(dfl_drafter *d, const char *dir, int n_target_layers);
/* The same; check_weights scans every tensor it binds for NaN/Inf (DFL_ERR naming each one). */
int drafter_open_checked(dfl_drafter *d, const char *dir, int n_target_layers, int check_weights);
void drafter_close(dfl_drafter *d);

/* Compatibility of a drafter with a target: hidden size, vocab (mask id), layer ids, block
 * size. Returns DFL_OK or DFL_ERR with every reason in the message. */
int drafter_check_target(const dfl_drafter *d, const dfl_model *target);
/* What a caller should tell the user about a pair drafter_check_target accepts: the drafter's
 * num_target_layers differs from the target's layer count. The message goes into buf (len
 * bytes) and buf is returned; NULL when there is nothing to say. */
const char *drafter_target_warning(const dfl_drafter *d, const dfl_model *target, char *buf, size_t len);

/* Attention inside the block (docs/design.md §4, "Block attention"); the values of cfg.causal:
 * -1 causal in sliding_attention layers only, full layers bidirectional (SpecForge, SGLang; the
 * default where the config sets neither is_causal nor dflash_config.causal); 0 bidirectional in
 * every layer (z-lab's reference model); 1 causal in every layer. AUTO: the checkpoint's config. */
#define DFL_BLOCK_ATTN_AUTO (-2)
#define DFL_BLOCK_ATTN_SLIDING (-1)
#define DFL_BLOCK_ATTN_BIDIRECTIONAL 0
#define DFL_BLOCK_ATTN_CAUSAL 1

/* Draft with block attention `causal` (-1, 0, 1; DFL_BLOCK_ATTN_AUTO: back to the config's) from
 * the next draft on. DFL_ERR, nothing changed, for another value or for 0 where a sliding layer's
 * window is smaller than block_size (as the config check: the window would cut the block). */
int drafter_set_causal(dfl_drafter *d, int causal);
/* The number of sliding_attention layers; 0: -1 and 0 give the same drafts. */
int drafter_has_sliding(const dfl_drafter *d);
/* One line for reports: what the drafter does inside the block and where the setting came from
 * (config field, default or drafter_set_causal). Valid until the next drafter_set_causal. */
const char *drafter_attn_semantics(const dfl_drafter *d);
/* "sliding-causal", "bidirectional", "causal" for -1, 0, 1; "auto" for DFL_BLOCK_ATTN_AUTO; else NULL. */
const char *drafter_causal_name(int causal);
/* The inverse (what --block-attn takes): DFL_OK and *causal, or DFL_ERR naming the names. */
int drafter_causal_parse(const char *s, int *causal);
/* Where cfg.causal came from: "override" (drafter_set_causal), "is_causal", "dflash_config.causal"
 * or "default". */
const char *drafter_causal_source(const dfl_drafter *d);
/* The setting as one JSON object onto f: {"mode", "effective" (what the layers do: bidirectional
 * for sliding-causal without sliding layers), "source", "config" (the config's mode),
 * "sliding_layers", "sliding_window", "semantics" (drafter_attn_semantics)}. */
void drafter_attn_json(FILE *f, const dfl_drafter *d);

/* Drafter run state: context K/V per layer cached across rounds (positions 0..n_ctx-1, the
 * committed positions whose target features were added); the block's K/V are never cached. */
typedef struct dfl_drafter_state {
    const dfl_drafter *d;
    const dfl_model *t; /* target: embedding and lm_head */
    int max_ctx;        /* context positions */
    int max_block;      /* block size B (tokens per draft forward) */
    int n_ctx;          /* cached context positions = committed positions of the target */
    float **k_ctx;      /* [Ld] [max_ctx, Hkv*hd] after k_norm and RoPE */
    float **v_ctx;      /* [Ld] [max_ctx, Hkv*hd] */
    /* scratch */
    float *ctx;         /* [max_block, H] context vectors being added (fc + hidden_norm) */
    float *x, *xn;      /* [B, H] */
    float *q;           /* [B, Hq*hd] */
    float *kb, *vb;     /* [B, Hkv*hd] block keys/values */
    float *att;         /* [B, Hq*hd] */
    float *mlp1, *mlp2; /* [B, I] */
    float *scores;      /* [threads, max_ctx + B] */
    float *inv_freq;    /* [hd/2] */
    /* DFlash2 (NULL for DFlash); K = selector_top_k */
    float *cdelta;     /* [B, 2*T*G] convolution deltas of the sublayer being run */
    float *conv;       /* [B, H] convolution output */
    float *sel_h;      /* [B + 2, R] hidden_projection of the final hidden states; 2 rows scratch */
    int32_t *cand;     /* [B, K] last draft: each position's candidates, best logit first */
    float *cand_logit; /* [B, K] their logits */
    int32_t *walk;     /* [B] last draft: the selector's block (row k: the token at start+k+1) */
    float *batch;      /* drafter_draft_many's activations [batch_rows, ...] (grown on demand) */
    float *feat_in;    /* [max_block, n_feat*H] features read from a device (allocated on first use) */
    int batch_rows;
    uint64_t bytes;
} dfl_drafter_state;

int drafter_state_init(dfl_drafter_state *s, const dfl_drafter *d, const dfl_model *target, int max_ctx, int max_block);
void drafter_state_free(dfl_drafter_state *s);
void drafter_state_reset(dfl_drafter_state *s);

/* Append context features for positions n_ctx..n_ctx+n-1: feat [n, n_feat*H] = the target's
 * layer outputs at target_layer_ids, concatenated per position. Computes fc -> hidden_norm and
 * every layer's context K/V. n may exceed max_block (processed in chunks). */
int drafter_add_context(dfl_drafter_state *s, const float *feat, int n);
/* The same from rows 0..n-1 of a feature handle: host rows in place, a device's read max_block
 * rows at a time. */
int drafter_add_features(dfl_drafter_state *s, const dfl_feat *f, int n);

/* Draft one block [anchor, MASK x (B-1)] at positions n_ctx..n_ctx+B-1 (the anchor's own
 * position never has a feature: the context ends right before it). logits: [B-1, V], row k-1
 * predicts the token at position n_ctx+k. For a DFlash2 drafter the rows are the selector's
 * scores along its walk: -inf except at row k-1's candidates, each scored from the token the
 * walk chose before it (the anchor for row 0), so each row's argmax is the selector's block
 * (s->walk) and a sampler draws among the candidates. */
int drafter_draft(dfl_drafter_state *s, int32_t anchor, int B, float *logits);
/* drafter_draft's rows' argmaxes alone, ids [B-1] (a chain's greedy draft): the same ids as
 * kn_argmax of its logits, bit for bit. scratch [B-1, V] (not all of it filled: a plain DFlash
 * head finds the argmax without every row in float32, kn_matmul_argmax). */
int drafter_draft_ids(dfl_drafter_state *s, int32_t anchor, int B, int32_t *ids, float *scratch);
/* nb independent blocks in one forward (the weights stream once): block b is [anchors[b], MASK x
 * (B-1)] at positions starts[b].., on the context positions < starts[b] (each starts[b] <= n_ctx).
 * logits [nb * (B-1), V], block after block; each block's rows equal drafter_draft's on a context
 * of starts[b] positions. DFlash only (a DFlash2 drafter drafts one block at a time). */
int drafter_draft_many(dfl_drafter_state *s, const int32_t *anchors, const int *starts, int nb, int B, float *logits);
/* drafter_draft_many over the contexts of several states of one drafter (replay walks many
 * prompts in lockstep): block b on the context positions < starts[b] of ctx[b] (each starts[b] <=
 * ctx[b]->n_ctx; the states share drafter, target, max_ctx and max_block); ctx[0]'s scratch holds
 * the batch. Each block's rows equal drafter_draft's on that context, bit for bit. DFlash only. */
int drafter_draft_across(dfl_drafter_state *const *ctx, const int32_t *anchors, const int *starts, int nb, int B,
                         float *logits);
/* drafter_draft_across's rows' argmaxes alone, ids [nb * (B-1)], as drafter_draft_ids. */
int drafter_draft_across_ids(dfl_drafter_state *const *ctx, const int32_t *anchors, const int *starts, int nb, int B,
                             int32_t *ids, float *scratch);

#endif
