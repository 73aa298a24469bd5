/* config.json of targets (qwen3, qwen3_moe, qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text)
 * and DFlash drafters. */
#ifndef DFL_CONFIG_H
#define DFL_CONFIG_H

#define DFL_MAX_LAYERS 256
#define DFL_MAX_EOS 8

typedef enum dfl_arch {
    DFL_ARCH_QWEN3,   /* Qwen3 attention layers (model_type qwen3; qwen3_moe: n_experts > 0) */
    DFL_ARCH_QWEN3_5, /* hybrid Gated-DeltaNet + gated attention (qwen3_5, qwen3_5_text;
                       * qwen3_5_moe, qwen3_5_moe_text: n_experts > 0) */
    DFL_ARCH_DFLASH,  /* DFlash block drafter (architectures: DFlashDraftModel or DFlash2DraftModel) */
} dfl_arch;

typedef enum dfl_layer_type {
    DFL_LAYER_FULL,    /* full (causal) attention */
    DFL_LAYER_LINEAR,  /* Gated DeltaNet linear attention */
    DFL_LAYER_SLIDING, /* sliding-window attention (drafters) */
} dfl_layer_type;

/* The config field a drafter's block attention came from (dfl_config.causal_field). */
typedef enum dfl_causal_field {
    DFL_CAUSAL_UNSET,         /* neither: the default, sliding layers causal */
    DFL_CAUSAL_IS_CAUSAL,     /* top-level is_causal */
    DFL_CAUSAL_DFLASH_CONFIG, /* dflash_config.causal */
} dfl_causal_field;

typedef struct dfl_config {
    dfl_arch arch;
    char model_type[64];   /* as written in config.json (top level) */
    char architecture[96]; /* architectures[0], "" when absent */
    int text_config;       /* 1 if the text settings came from "text_config" (VLM config) */

    int hidden;       /* H */
    int n_layers;     /* L */
    int intermediate; /* dense MLP inner size (0 when every layer is sparse) */
    int n_heads;      /* Hq */
    int n_kv_heads;   /* Hkv */
    int head_dim;     /* hd */
    int vocab;        /* V (0 for drafters: they use the target's) */
    float rms_eps;
    double rope_theta;
    float partial_rotary; /* fraction of head_dim that rotates (1 for qwen3) */
    int rot_dim;          /* head_dim * partial_rotary, even */
    /* What the architecture implies, derived once when the config is read (so that the forwards
     * test features, not model types): */
    int attn_gate;     /* full attention has an output gate: q_proj rows [query | gate] per head */
    int norm_plus_one; /* RMSNorm weights are stored zero-centred: the multiplier is 1 + w */
    int tie_embeddings;
    int max_position;
    dfl_layer_type layer_types[DFL_MAX_LAYERS];

    /* Qwen3.5 linear attention (Gated DeltaNet) */
    int lin_k_heads; /* Hk */
    int lin_v_heads; /* Hv */
    int lin_k_dim;   /* dk */
    int lin_v_dim;   /* dv */
    int conv_kernel; /* K */
    int mtp_layers;  /* mtp_num_hidden_layers (1 when absent, as vLLM reads it; mtp.* tensors decide
                      * whether the checkpoint has an MTP head) */

    /* Mixture of experts (qwen3_moe, qwen3_5_moe): n_experts == 0 for dense models */
    int n_experts;                           /* E: routed experts per sparse layer (num_experts) */
    int n_experts_per_tok;                   /* k: experts each token is routed to (num_experts_per_tok) */
    int moe_intermediate;                    /* inner size of one routed expert (moe_intermediate_size) */
    int shared_intermediate;                 /* inner size of the gated shared expert; 0 = none (qwen3_moe) */
    int norm_topk_prob;                      /* renormalise the k routing weights to sum 1 (always for qwen3_5_moe) */
    unsigned char moe_layer[DFL_MAX_LAYERS]; /* 1: sparse MoE block, 0: dense MLP (qwen3_moe's
                                              * decoder_sparse_step and mlp_only_layers) */

    /* DFlash drafter */
    int block_size;
    int mask_token_id;
    int n_target_layers; /* num_target_layers (0 when absent) */
    int target_layer_ids[DFL_MAX_LAYERS];
    int n_target_ids;
    int target_ids_default; /* 1 if target_layer_ids came from the default formula */
    int sliding_window;     /* 0 = none */
    float input_embedding_scale;
    float output_multiplier;
    float final_logit_softcap; /* 0 = none */
    /* attention inside the block (docs/design.md §4), DFlash and DFlash2: -1 causal in sliding
     * layers only (unset: the default), 0 bidirectional everywhere, 1 causal everywhere */
    int causal;
    int causal_field; /* where causal came from: DFL_CAUSAL_UNSET, _IS_CAUSAL, _DFLASH_CONFIG */

    /* DFlash2 drafter (architectures: DFlash2DraftModel; docs/dflash2.md); dflash2 = 0 for DFlash */
    int dflash2;
    int conv_taps;      /* conv_kernel_size: taps of the grouped depthwise convolution */
    int conv_group;     /* conv_group_size: channels sharing one dynamic coefficient */
    int selector_rank;  /* R of the candidate selector's codebooks */
    int selector_top_k; /* K candidates per block position */

    int eos_ids[DFL_MAX_EOS]; /* config.json eos_token_id, then config_load_eos's */
    int n_eos;
} dfl_config;

/* Load DIR/config.json. Errors name the file and field, expected vs found. */
int config_load(dfl_config *c, const char *dir);
/* Parse a config from JSON text; `where` names it in messages. Every integer field is range
 * checked (non-integral values refused) before it is converted. */
int config_parse(dfl_config *c, const char *json, const char *where);
/* Add the eos ids of DIR/generation_config.json (eos_token_id) and DIR/tokenizer_config.json
 * (eos_token through added_tokens_decoder), both optional, to c->eos_ids; each must be
 * < c->vocab. Errors name the file and field. */
int config_load_eos(dfl_config *c, const char *dir);

/* Default DFlash target_layer_ids for k draft layers over n target layers (docs/design.md §4). */
void config_default_target_ids(int n_target_layers, int k, int *out);

const char *config_arch_name(dfl_arch a);
/* Number of sparse (MoE) layers. */
int config_n_moe_layers(const dfl_config *c);
const char *config_layer_type_name(dfl_layer_type t);
/* Pattern string such as "LLLFLLLF" (L linear, F full, S sliding) into buf. */
void config_layer_pattern(const dfl_config *c, char *buf, int buflen);

#endif
