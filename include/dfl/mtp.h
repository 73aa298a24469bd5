/* The multi-token-prediction (MTP) head that Qwen3.5/3.6 checkpoints ship (`mtp.*`), run as a
 * drafter (docs/speculative.md, "The target's MTP head"): k autoregressive steps of its layer,
 * the first from the target's hidden state and the next token's embedding, each next one from
 * the previous step's output and its argmax token; the target's embedding and lm_head.
 * It follows vLLM's Qwen3_5MultiTokenPredictor and its EAGLE/MTP proposer:
 *   u = fc([RMSNorm_emb(embed(x_{i+1})) ; RMSNorm_hidden(h_i)])       (zero-centred norms, 1 + w)
 *   y = RMSNorm_mtp(layer(u))  at position i, with its own KV cache;  logits = lm_head(y)
 * h_i is the target's hidden state after its final norm (what the target's lm_head reads);
 * step k+1 feeds y of step k at position i+1. On a Qwen3.5-MoE checkpoint the layer's MLP is a
 * sparse MoE block, computed by the target's own MoE routine (moe_forward). */
#ifndef DFL_MTP_H
#define DFL_MTP_H

#include <stddef.h>

#include "dfl/model.h"
#include "dfl/draft.h"

/* Block size when --block-size is not given: 3 MTP steps a round. B-1 is vLLM's
 * num_speculative_tokens; give --block-size to match a serving configuration. */
#define DFL_MTP_DEFAULT_BLOCK 4

typedef struct dfl_mtp {
    char *dir;       /* checkpoint the mtp.* tensors come from */
    dfl_quant quant; /* its quantization_config (an FP8 release's head may hold F8_E4M3) */
    st_checkpoint st;
    float *norm_emb;       /* [H] pre_fc_norm_embedding, 1 + w */
    float *norm_hidden;    /* [H] pre_fc_norm_hidden, 1 + w */
    dfl_mat fc;            /* [H, 2H] over [embedding ; hidden] */
    dfl_layer_w layer;     /* mtp.layers.0: a gated full-attention layer (norms 1 + w) with a dense
                            * MLP (qwen3_5) or a sparse MoE block like the target's (qwen3_5_moe) */
    float *norm;           /* [H] final mtp norm, 1 + w */
    dfl_config cfg;        /* the checkpoint's config: the MLP's sizes, the MoE's experts and top-k */
    unsigned char *used;   /* [n_tensors] */
    int n_tensors;         /* mtp.* tensors in the checkpoint */
    uint64_t weight_bytes; /* bytes of the mtp.* tensors read */
} dfl_mtp;

/* The drafter argument names the MTP head: "mtp" (the target's own checkpoint) or "DIR:mtp"
 * (the mtp.* tensors of checkpoint DIR). Writes the checkpoint directory into dir (len bytes)
 * and returns 1; returns 0 when arg names something else (a drafter directory). */
int mtp_parse_arg(const char *arg, const char *target_dir, char *dir, size_t len);

/* Tensors named mtp.* in an open checkpoint (0: the checkpoint offers no MTP head). */
int mtp_count_tensors(const st_checkpoint *st);

/* Open the MTP head of checkpoint dir for the target t: dir's config must describe the same text
 * model (hidden size, heads, vocabulary) and name one MTP layer; every mtp.* tensor is bound
 * with its shape checked. A checkpoint without mtp.* tensors is refused naming it. */
int mtp_open(dfl_mtp *h, const char *dir, const dfl_model *t, int check_weights);
void mtp_close(dfl_mtp *h);

/* Run state: the MTP layer's K/V per position, and the target hidden state of the last committed
 * position, which waits for the token after it (the next round's anchor). */
typedef struct dfl_mtp_state {
    const dfl_mtp *h;
    const dfl_model *t; /* embedding, final norm, lm_head, attention shapes */
    int max_ctx, max_block;
    int n_ctx;         /* committed positions whose features were added */
    int feature_layer; /* the target's last decoder layer, L-1 */
    float *k_cache;    /* [max_ctx, Hkv*hd] after k_norm and RoPE; row i from (h_i, x_{i+1}) */
    float *v_cache;    /* [max_ctx, Hkv*hd] */
    float *pending;    /* [H] final-normed target hidden state of position n_ctx-1 */
    /* scratch (rows: max_block) */
    float *hid;         /* [rows, H] final-normed hidden states in */
    float *cat;         /* [rows, 2H] [norm_emb(embedding) ; norm_hidden(h)] */
    float *x, *xn;      /* [rows, H] */
    float *q;           /* [rows, Hq*hd*2] query | gate per head */
    float *k, *v;       /* [rows, Hkv*hd] */
    float *att;         /* [rows, Hq*hd] */
    float *mlp1, *mlp2; /* [rows, max(I, k*Ie, Is)] dense MLP / expert / shared expert inner rows */
    dfl_moe_buf moe;    /* MoE layer scratch (one row: a step runs one position) */
    float *scores;      /* [max_ctx] */
    float *inv_freq;    /* [rot/2] */
    float *feat_in;     /* [max_block, H] features read from a device (allocated on first use) */
    uint64_t bytes;
} dfl_mtp_state;

/* max_block: the widest block drafted (B: B-1 MTP steps) and the rows per context chunk. */
int mtp_state_init(dfl_mtp_state *s, const dfl_mtp *h, const dfl_model *t, int max_ctx, int max_block);
void mtp_state_free(dfl_mtp_state *s);
void mtp_state_reset(dfl_mtp_state *s);

/* Append committed positions n_ctx..n_ctx+n-1: feat [n, H] the target's last decoder layer output
 * there (before the final norm), tokens [n] the tokens at those positions. Each token completes
 * the pair (h_{i}, x_{i+1}) of the position before it, whose K/V enter the cache. */
int mtp_add_context(dfl_mtp_state *s, const float *feat, const int32_t *tokens, int n);
/* The same from rows 0..n-1 of a feature handle (host rows in place, a device's read in chunks). */
int mtp_add_features(dfl_mtp_state *s, const dfl_feat *f, const int32_t *tokens, int n);

/* B-1 autoregressive steps from the anchor (the token at position n_ctx): logits [B-1, V], row
 * k-1 predicts the token at position n_ctx+k, each step conditioned on the argmax of the ones
 * before it. Draft steps' K/V sit past the committed pairs and are overwritten later. */
int mtp_draft(dfl_mtp_state *s, int32_t anchor, int B, float *logits);

/* The MTP head as the speculative loop's drafter; it reads the target's last decoder layer. */
dfl_draft_if mtp_drafter_if(dfl_mtp_state *s);

#endif
