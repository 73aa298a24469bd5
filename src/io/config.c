/* config.json parsing for targets and drafters (docs/design.md §1–4). */
#include "dfl/config.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"

#define SUPPORTED                                                                                            \
    "qwen3 (Qwen3ForCausalLM), qwen3_moe (Qwen3MoeForCausalLM), qwen3_5 (Qwen3_5ForConditionalGeneration), " \
    "qwen3_5_text (Qwen3_5ForCausalLM), qwen3_5_moe (Qwen3_5MoeForConditionalGeneration), "                  \
    "qwen3_5_moe_text (Qwen3_5MoeForCausalLM), DFlashDraftModel, DFlash2DraftModel"

const char *config_arch_name(dfl_arch a) {
    switch (a) {
    case DFL_ARCH_QWEN3: return "qwen3";
    case DFL_ARCH_QWEN3_5: return "qwen3_5";
    case DFL_ARCH_DFLASH: return "dflash";
    }
    return "?";
}

const char *config_layer_type_name(dfl_layer_type t) {
    switch (t) {
    case DFL_LAYER_FULL: return "full_attention";
    case DFL_LAYER_LINEAR: return "linear_attention";
    case DFL_LAYER_SLIDING: return "sliding_attention";
    }
    return "?";
}

int config_n_moe_layers(const dfl_config *c) {
    int k = 0;
    for (int i = 0; i < c->n_layers; i++) k += c->n_experts > 0 && c->moe_layer[i];
    return k;
}

void config_layer_pattern(const dfl_config *c, char *buf, int buflen) {
    int n = c->n_layers < buflen - 1 ? c->n_layers : buflen - 1;
    for (int i = 0; i < n; i++)
        buf[i] = c->layer_types[i] == DFL_LAYER_LINEAR ? 'L' : c->layer_types[i] == DFL_LAYER_SLIDING ? 'S' : 'F';
    buf[n < 0 ? 0 : n] = 0;
}

void config_default_target_ids(int n, int k, int *out) {
    if (k == 1) {
        out[0] = n / 2;
        return;
    }
    /* Python's round(): ties to even, on the same double arithmetic as the reference. */
    for (int i = 0; i < k; i++) out[i] = (int)nearbyint(1.0 + (double)(i * (n - 4)) / (double)(k - 1));
}

/* Bounds of the sizes a config may declare: each keeps the products the loader and the forward
 * form from them (rows x cols of a weight, heads x head_dim, ...) inside an int. */
#define MAX_HIDDEN (1 << 16)
#define MAX_INTERMEDIATE (1 << 20)
#define MAX_HEADS (1 << 10)
#define MAX_HEAD_DIM 512 /* the drafter's RoPE tables are stack arrays of head_dim / 2 */
#define MAX_VOCAB (1 << 24)
#define MAX_POSITION (1 << 30)
#define MAX_EXPERTS 4096

/* An integer in [lo, hi], checked on the double before the cast (casting an out-of-range double
 * is undefined). bound, when not NULL, names the field hi + 1 comes from (eos ids < vocab_size). */
static int int_value(const cJSON *v, const char *where, const char *field, double lo, double hi, const char *bound,
                     int *out) {
    char b[64];
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != floor(v->valuedouble)) {
        if (bound)
            return dfl_seterr("%s: %s: expected an integer in [%.0f, %s = %.0f), found %s", where, field, lo, bound,
                              hi + 1, dfl_json_brief(v, b, sizeof b));
        return dfl_seterr("%s: %s: expected an integer in [%.0f, %.0f], found %s", where, field, lo, hi,
                          dfl_json_brief(v, b, sizeof b));
    }
    *out = (int)v->valuedouble;
    return DFL_OK;
}

/* Integer field in [lo, hi]: *out set when present; required fields missing -> error. */
static int get_int(const cJSON *o, const char *name, const char *where, int required, double lo, double hi, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) {
        if (required) return dfl_seterr("%s: missing required field '%s'", where, name);
        return DFL_OK;
    }
    return int_value(v, where, name, lo, hi, NULL, out);
}

/* Number field, finite and in [lo, hi]. */
static int get_num(const cJSON *o, const char *name, const char *where, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    char b[64];
    if (!v || cJSON_IsNull(v)) return DFL_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return dfl_seterr("%s: %s: expected a number in [%g, %g], found %s", where, name, lo, hi,
                          dfl_json_brief(v, b, sizeof b));
    *out = v->valuedouble;
    return DFL_OK;
}

static int get_bool(const cJSON *o, const char *name, const char *where, int *out, int *present) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (present) *present = 0;
    if (!v || cJSON_IsNull(v)) return DFL_OK;
    if (!cJSON_IsBool(v)) return dfl_seterr("%s: field '%s' must be true or false", where, name);
    *out = cJSON_IsTrue(v);
    if (present) *present = 1;
    return DFL_OK;
}

/* Rope settings: nested rope_parameters (transformers 5) or top-level rope_theta / rope_scaling. */
static int parse_rope(dfl_config *c, const cJSON *tc, const char *where) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(tc, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(tc, "rope_scaling");
    double theta = c->rope_theta, partial = c->partial_rotary;
    if (get_num(tc, "rope_theta", where, 0, 1e30, &theta) ||
        get_num(tc, "partial_rotary_factor", where, 0, 1, &partial))
        return DFL_ERR;
    const cJSON *src[2] = {rp, rs};
    for (int i = 0; i < 2; i++) {
        if (!src[i] || cJSON_IsNull(src[i])) continue;
        if (!cJSON_IsObject(src[i]))
            return dfl_seterr("%s: field '%s' must be an object", where, i ? "rope_scaling" : "rope_parameters");
        if (get_num(src[i], "rope_theta", where, 0, 1e30, &theta) ||
            get_num(src[i], "partial_rotary_factor", where, 0, 1, &partial))
            return DFL_ERR;
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(src[i], "rope_type");
        if (!ty) ty = cJSON_GetObjectItemCaseSensitive(src[i], "type");
        if (ty && cJSON_IsString(ty) && strcmp(ty->valuestring, "default") != 0)
            return dfl_seterr("%s: rope_type '%s' is not supported (only 'default' rotary embeddings are)", where,
                              ty->valuestring);
    }
    if (!(theta > 0)) return dfl_seterr("%s: rope_theta must be > 0, found %g", where, theta);
    if (!(partial > 0 && partial <= 1))
        return dfl_seterr("%s: partial_rotary_factor must be in (0, 1], found %g", where, partial);
    c->rope_theta = theta;
    c->partial_rotary = (float)partial;
    return DFL_OK;
}

static int parse_layer_types(dfl_config *c, const cJSON *tc, const char *where, int full_interval) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(tc, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt)) return dfl_seterr("%s: field 'layer_types' must be an array of strings", where);
        int n = cJSON_GetArraySize(lt);
        if (n != c->n_layers)
            return dfl_seterr("%s: layer_types has %d entries, expected num_hidden_layers = %d", where, n, c->n_layers);
        for (int i = 0; i < n; i++) {
            const cJSON *s = cJSON_GetArrayItem(lt, i);
            if (!cJSON_IsString(s)) return dfl_seterr("%s: layer_types[%d] is not a string", where, i);
            const char *v = s->valuestring;
            if (strcmp(v, "full_attention") == 0 || strcmp(v, "attention") == 0) c->layer_types[i] = DFL_LAYER_FULL;
            else if (strcmp(v, "linear_attention") == 0) c->layer_types[i] = DFL_LAYER_LINEAR;
            else if (strcmp(v, "sliding_attention") == 0) c->layer_types[i] = DFL_LAYER_SLIDING;
            else
                return dfl_seterr("%s: layer_types[%d] = '%s', expected full_attention, linear_attention or "
                                  "sliding_attention",
                                  where, i, v);
        }
        return DFL_OK;
    }
    for (int i = 0; i < c->n_layers; i++)
        c->layer_types[i] = full_interval > 0 && (i + 1) % full_interval != 0 ? DFL_LAYER_LINEAR : DFL_LAYER_FULL;
    return DFL_OK;
}

/* Append an eos id unless it is already there. */
static int add_eos(dfl_config *c, int id, const char *where, const char *field) {
    for (int k = 0; k < c->n_eos; k++)
        if (c->eos_ids[k] == id) return DFL_OK;
    if (c->n_eos == DFL_MAX_EOS) return dfl_seterr("%s: %s: more than %d distinct eos ids", where, field, DFL_MAX_EOS);
    c->eos_ids[c->n_eos++] = id;
    return DFL_OK;
}

/* eos_token_id: an id or a list of ids (null: none), each < vocab_size. */
static int parse_eos(dfl_config *c, const cJSON *o, const char *where) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    if (!e || cJSON_IsNull(e)) return DFL_OK;
    const int n = cJSON_IsArray(e) ? cJSON_GetArraySize(e) : 1;
    for (int i = 0; i < n; i++) {
        char field[48];
        snprintf(field, sizeof field, cJSON_IsArray(e) ? "eos_token_id[%d]" : "eos_token_id", i);
        int id;
        if (int_value(cJSON_IsArray(e) ? cJSON_GetArrayItem(e, i) : e, where, field, 0, c->vocab - 1, "vocab_size",
                      &id) ||
            add_eos(c, id, where, field))
            return DFL_ERR;
    }
    return DFL_OK;
}

/* need_intermediate: intermediate_size is required (dense models, drafters); MoE configs may
 * omit it and need it only for dense layers (parse_moe checks). */
static int parse_common(dfl_config *c, const cJSON *tc, const char *where, int need_intermediate) {
    c->head_dim = 0;
    if (get_int(tc, "hidden_size", where, 1, 1, MAX_HIDDEN, &c->hidden) ||
        get_int(tc, "num_hidden_layers", where, 1, 1, DFL_MAX_LAYERS, &c->n_layers) ||
        get_int(tc, "intermediate_size", where, need_intermediate, 1, MAX_INTERMEDIATE, &c->intermediate) ||
        get_int(tc, "num_attention_heads", where, 1, 1, MAX_HEADS, &c->n_heads) ||
        get_int(tc, "num_key_value_heads", where, 0, 1, MAX_HEADS, &c->n_kv_heads) ||
        get_int(tc, "head_dim", where, 0, 1, MAX_HEAD_DIM, &c->head_dim) ||
        get_int(tc, "max_position_embeddings", where, 0, 1, MAX_POSITION, &c->max_position))
        return DFL_ERR;
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (c->n_heads % c->n_kv_heads != 0)
        return dfl_seterr("%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", where,
                          c->n_heads, c->n_kv_heads);
    if (c->head_dim == 0) {
        if (c->hidden % c->n_heads)
            return dfl_seterr("%s: no head_dim and hidden_size %d is not divisible by num_attention_heads %d", where,
                              c->hidden, c->n_heads);
        c->head_dim = c->hidden / c->n_heads;
        if (c->head_dim > MAX_HEAD_DIM)
            return dfl_seterr("%s: head_dim = hidden_size / num_attention_heads = %d exceeds the supported %d", where,
                              c->head_dim, MAX_HEAD_DIM);
    }
    double eps = 1e-6;
    if (get_num(tc, "rms_norm_eps", where, 0, 1, &eps)) return DFL_ERR;
    c->rms_eps = (float)eps;
    if (parse_rope(c, tc, where)) return DFL_ERR;
    c->rot_dim = (int)(c->head_dim * c->partial_rotary);
    c->rot_dim -= c->rot_dim % 2;
    if (c->rot_dim <= 0)
        return dfl_seterr("%s: rotary dimension is 0 (head_dim %d x %g)", where, c->head_dim, c->partial_rotary);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(tc, "hidden_act");
    if (act && cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0)
        return dfl_seterr("%s: hidden_act '%s' is not supported (silu is)", where, act->valuestring);
    int bias = 0;
    if (get_bool(tc, "attention_bias", where, &bias, NULL)) return DFL_ERR;
    if (bias) return dfl_seterr("%s: attention_bias = true is not supported (Qwen3 has no biases)", where);
    return DFL_OK;
}

/* DFlash2's fields, each in dflash_config (z-lab's files) or at the top level (speculators'
 * files); none has a default: vLLM reads all four from the config. */
static int parse_dflash2(dfl_config *c, const cJSON *const srcs[2], const char *where) {
    if (c->vocab <= 0)
        return dfl_seterr("%s: DFlash2DraftModel needs 'vocab_size' (the rows of the selector's codebooks)", where);
    static const char *const names[4] = {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"};
    int *const dst[4] = {&c->conv_taps, &c->conv_group, &c->selector_rank, &c->selector_top_k};
    /* taps reach back inside the block; a group divides the hidden size; K candidates of V */
    const double hi[4] = {c->block_size, c->hidden, MAX_HIDDEN, c->vocab};
    for (int f = 0; f < 4; f++) {
        const cJSON *v = NULL;
        for (int s = 0; s < 2 && !v; s++)
            if (srcs[s] && cJSON_IsObject(srcs[s])) {
                v = cJSON_GetObjectItemCaseSensitive(srcs[s], names[f]);
                if (cJSON_IsNull(v)) v = NULL;
            }
        if (!v)
            return dfl_seterr("%s: DFlash2DraftModel needs '%s' (in dflash_config or at top level)", where, names[f]);
        if (int_value(v, where, names[f], 1, hi[f], NULL, dst[f])) return DFL_ERR;
    }
    if (c->hidden % c->conv_group)
        return dfl_seterr("%s: conv_group_size %d does not divide hidden_size %d", where, c->conv_group, c->hidden);
    return DFL_OK;
}

/* Attention inside the block (docs/design.md §4), DFlash and DFlash2 alike. vLLM's order:
 * top-level is_causal, then dflash_config.causal, else -1 (sliding layers causal). */
static int parse_causal(dfl_config *c, const cJSON *const srcs[2], const char *where) {
    int causal = 0, present = 0;
    c->causal = -1;
    c->causal_field = DFL_CAUSAL_UNSET;
    if (get_bool(srcs[1], "is_causal", where, &causal, &present)) return DFL_ERR;
    if (present) c->causal_field = DFL_CAUSAL_IS_CAUSAL;
    if (!present && srcs[0] && cJSON_IsObject(srcs[0])) {
        char w[512];
        snprintf(w, sizeof w, "%s: dflash_config", where);
        if (get_bool(srcs[0], "causal", w, &causal, &present)) return DFL_ERR;
        if (present) c->causal_field = DFL_CAUSAL_DFLASH_CONFIG;
    }
    if (present) c->causal = causal;
    /* a bidirectional window is only unambiguous when the block fits in it */
    for (int i = 0; i < c->n_layers; i++)
        if (c->layer_types[i] == DFL_LAYER_SLIDING && c->causal == 0 && c->sliding_window < c->block_size)
            return dfl_seterr("%s: sliding_window %d is smaller than block_size %d in a non-causal (%s false) "
                              "sliding_attention layer %d",
                              where, c->sliding_window, c->block_size,
                              c->causal_field == DFL_CAUSAL_IS_CAUSAL ? "is_causal" : "dflash_config.causal", i);
    return DFL_OK;
}

static int parse_drafter(dfl_config *c, const cJSON *root, const char *where) {
    c->arch = DFL_ARCH_DFLASH;
    c->rope_theta = 1e6;
    c->partial_rotary = 1.0f;
    if (parse_common(c, root, where, 1)) return DFL_ERR;
    if (get_int(root, "vocab_size", where, 0, 1, MAX_VOCAB, &c->vocab)) return DFL_ERR;
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(root, "dflash_config");
    if (dc && !cJSON_IsNull(dc) && !cJSON_IsObject(dc))
        return dfl_seterr("%s: field 'dflash_config' must be an object", where);
    /* dflash_config first, top-level fields as the fallback (older files). */
    const cJSON *srcs[2] = {dc, root};
    c->block_size = 16;
    c->mask_token_id = -1;
    int have_mask = 0;
    const cJSON *ids = NULL;
    for (int s = 1; s >= 0; s--) {
        if (!srcs[s] || !cJSON_IsObject(srcs[s])) continue;
        const cJSON *mask = cJSON_GetObjectItemCaseSensitive(srcs[s], "mask_token_id");
        if (mask) {
            if (int_value(mask, where, "mask_token_id", 0, c->vocab > 0 ? c->vocab - 1 : MAX_VOCAB - 1,
                          c->vocab > 0 ? "vocab_size" : NULL, &c->mask_token_id))
                return DFL_ERR;
            have_mask = 1;
        }
        if (get_int(srcs[s], "block_size", where, 0, 2, 256, &c->block_size)) return DFL_ERR;
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(srcs[s], "target_layer_ids");
        if (x && !cJSON_IsNull(x)) ids = x;
    }
    if (!have_mask) return dfl_seterr("%s: missing 'mask_token_id' (in dflash_config or at top level)", where);
    if (get_int(root, "num_target_layers", where, 0, 1, DFL_MAX_LAYERS, &c->n_target_layers)) return DFL_ERR;
    if (ids) {
        if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) == 0 || cJSON_GetArraySize(ids) > DFL_MAX_LAYERS)
            return dfl_seterr("%s: target_layer_ids must be a non-empty array of integers", where);
        c->n_target_ids = cJSON_GetArraySize(ids);
        /* the bound that matters, < the target's layer count, is checked against the target */
        for (int i = 0; i < c->n_target_ids; i++) {
            char field[48];
            snprintf(field, sizeof field, "target_layer_ids[%d]", i);
            if (int_value(cJSON_GetArrayItem(ids, i), where, field, 0, DFL_MAX_LAYERS - 1, NULL,
                          &c->target_layer_ids[i]))
                return DFL_ERR;
        }
    } else if (c->n_target_layers > 0) {
        c->n_target_ids = c->n_layers;
        c->target_ids_default = 1;
        config_default_target_ids(c->n_target_layers, c->n_layers, c->target_layer_ids);
    } /* else: resolved against the target at load time (drafter_open) */
    if (parse_layer_types(c, root, where, 0)) return DFL_ERR;
    if (get_int(root, "sliding_window", where, 0, 0, MAX_POSITION, &c->sliding_window)) return DFL_ERR;
    int has_sliding = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (c->layer_types[i] == DFL_LAYER_LINEAR)
            return dfl_seterr("%s: layer_types[%d] = linear_attention is not a drafter layer type", where, i);
        has_sliding |= c->layer_types[i] == DFL_LAYER_SLIDING;
    }
    if (has_sliding && c->sliding_window <= 0)
        return dfl_seterr("%s: sliding_attention layers need sliding_window > 0, found %d", where, c->sliding_window);
    double scale = 1.0, mult = 1.0, cap = 0.0;
    for (int s = 1; s >= 0; s--) {
        if (!srcs[s] || !cJSON_IsObject(srcs[s])) continue;
        if (get_num(srcs[s], "input_embedding_scale", where, -FLT_MAX, FLT_MAX, &scale) ||
            get_num(srcs[s], "output_multiplier", where, -FLT_MAX, FLT_MAX, &mult) ||
            get_num(srcs[s], "final_logit_softcapping", where, 0, FLT_MAX, &cap))
            return DFL_ERR;
    }
    c->input_embedding_scale = (float)scale;
    c->output_multiplier = (float)mult;
    c->final_logit_softcap = (float)cap;
    if (parse_causal(c, srcs, where)) return DFL_ERR;
    return c->dflash2 ? parse_dflash2(c, srcs, where) : DFL_OK;
}

/* Sparse-MoE settings with transformers' defaults (Qwen3MoeConfig, Qwen3_5MoeTextConfig).
 * qwen3_moe: layer i is sparse unless listed in mlp_only_layers or (i + 1) % decoder_sparse_step
 * != 0, routing weights renormalised when norm_topk_prob; no shared expert. qwen3_5_moe: every
 * layer is sparse, weights always renormalised, plus a sigmoid-gated shared expert. */
static int parse_moe(dfl_config *c, const cJSON *tc, const char *where, int hybrid) {
    c->n_experts = hybrid ? 256 : 128;
    c->n_experts_per_tok = 8;
    c->moe_intermediate = hybrid ? 512 : 768;
    c->shared_intermediate = hybrid ? 512 : 0;
    c->norm_topk_prob = hybrid;
    int step = 1, local = -1;
    /* transformers 5 writes qwen3_moe's num_experts as num_local_experts (an attribute alias); for
     * qwen3_5_moe too it may only agree with num_experts (it was once ignored there) */
    if (get_int(tc, "num_local_experts", where, 0, 0, MAX_EXPERTS, &local)) return DFL_ERR;
    if (local >= 0) c->n_experts = local;
    if (get_int(tc, "num_experts", where, 0, 0, MAX_EXPERTS, &c->n_experts) ||
        get_int(tc, "num_experts_per_tok", where, 0, 1, MAX_EXPERTS, &c->n_experts_per_tok) ||
        get_int(tc, "moe_intermediate_size", where, 0, 1, MAX_INTERMEDIATE, &c->moe_intermediate))
        return DFL_ERR;
    if (local >= 0 && local != c->n_experts)
        return dfl_seterr("%s: num_experts %d and num_local_experts %d disagree", where, c->n_experts, local);
    if (hybrid &&
        get_int(tc, "shared_expert_intermediate_size", where, 0, 1, MAX_INTERMEDIATE, &c->shared_intermediate))
        return DFL_ERR;
    if (!hybrid && (get_bool(tc, "norm_topk_prob", where, &c->norm_topk_prob, NULL) ||
                    get_int(tc, "decoder_sparse_step", where, 0, 1, DFL_MAX_LAYERS, &step)))
        return DFL_ERR;
    if (c->n_experts > 0 && c->n_experts_per_tok > c->n_experts)
        return dfl_seterr("%s: num_experts_per_tok %d exceeds num_experts %d", where, c->n_experts_per_tok,
                          c->n_experts);
    for (int i = 0; i < c->n_layers; i++) c->moe_layer[i] = c->n_experts > 0 && (hybrid || (i + 1) % step == 0);
    const cJSON *only = hybrid ? NULL : cJSON_GetObjectItemCaseSensitive(tc, "mlp_only_layers");
    if (only && !cJSON_IsNull(only)) {
        if (!cJSON_IsArray(only)) return dfl_seterr("%s: field 'mlp_only_layers' must be an array of integers", where);
        for (int j = 0; j < cJSON_GetArraySize(only); j++) {
            char field[48];
            int li;
            snprintf(field, sizeof field, "mlp_only_layers[%d]", j);
            if (int_value(cJSON_GetArrayItem(only, j), where, field, 0, c->n_layers - 1, "num_hidden_layers", &li))
                return DFL_ERR;
            c->moe_layer[li] = 0;
        }
    }
    for (int i = 0; i < c->n_layers; i++)
        if (!c->moe_layer[i] && c->intermediate == 0)
            return dfl_seterr("%s: layer %d has a dense MLP but intermediate_size is missing", where, i);
    if (c->n_experts == 0) c->n_experts_per_tok = c->moe_intermediate = c->shared_intermediate = 0;
    return DFL_OK;
}

/* The first member, at any depth, whose key repeats an earlier key of the same object. */
static const cJSON *repeated_key(const cJSON *o) {
    for (const cJSON *a = o->child; a; a = a->next) {
        if (cJSON_IsObject(o))
            for (const cJSON *b = o->child; b != a; b = b->next)
                if (strcmp(a->string, b->string) == 0) return a;
        const cJSON *inner = cJSON_IsObject(a) || cJSON_IsArray(a) ? repeated_key(a) : NULL;
        if (inner) return inner;
    }
    return NULL;
}

/* config_parse's reading of the parsed document root into c. */
static int parse_root(dfl_config *c, const cJSON *root, const char *where) {
    if (!cJSON_IsObject(root)) {
        dfl_seterr("%s: not a JSON object", where);
        return DFL_ERR;
    }
    const cJSON *dup = repeated_key(root);
    if (dup) {
        dfl_seterr("%s: key '%s' appears twice in one object (transformers would take the last one, dfl the first)",
                   where, dup->string);
        return DFL_ERR;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        snprintf(c->architecture, sizeof c->architecture, "%s", cJSON_GetArrayItem(archs, 0)->valuestring);
    if (cJSON_IsString(mt)) snprintf(c->model_type, sizeof c->model_type, "%s", mt->valuestring);
    int is_drafter = 0;
    if (cJSON_IsArray(archs)) {
        const cJSON *a;
        cJSON_ArrayForEach(a, archs) {
            if (cJSON_IsString(a) && strcmp(a->valuestring, "DFlashDraftModel") == 0) is_drafter = 1;
            if (cJSON_IsString(a) && strcmp(a->valuestring, "DFlash2DraftModel") == 0) is_drafter = 1, c->dflash2 = 1;
        }
    }
    if (is_drafter) {
        return parse_drafter(c, root, where);
    }
    if (!cJSON_IsString(mt)) {
        dfl_seterr("%s: missing 'model_type'; supported: " SUPPORTED, where);
        return DFL_ERR;
    }
    const cJSON *tc = root;
    const char *mt_s = c->model_type;
    const int moe =
        strcmp(mt_s, "qwen3_moe") == 0 || strcmp(mt_s, "qwen3_5_moe") == 0 || strcmp(mt_s, "qwen3_5_moe_text") == 0;
    if (strcmp(mt_s, "qwen3") == 0 || strcmp(mt_s, "qwen3_moe") == 0) {
        c->arch = DFL_ARCH_QWEN3;
        c->rope_theta = 1e6;
        c->partial_rotary = 1.0f;
    } else if (strcmp(mt_s, "qwen3_5") == 0 || strcmp(mt_s, "qwen3_5_text") == 0 || strcmp(mt_s, "qwen3_5_moe") == 0 ||
               strcmp(mt_s, "qwen3_5_moe_text") == 0) {
        c->arch = DFL_ARCH_QWEN3_5;
        c->attn_gate = c->norm_plus_one = 1;
        c->rope_theta = 1e7;
        c->partial_rotary = 0.25f;
        if (strcmp(mt_s, "qwen3_5") == 0 || strcmp(mt_s, "qwen3_5_moe") == 0) {
            tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
            if (!cJSON_IsObject(tc)) {
                dfl_seterr("%s: model_type %s (vision-language) needs an object 'text_config'", where, mt_s);
                return DFL_ERR;
            }
            c->text_config = 1;
        }
    } else {
        dfl_seterr("%s: unsupported model_type '%s'; supported: " SUPPORTED, where, c->model_type);
        return DFL_ERR;
    }
    if (parse_common(c, tc, where, !moe) || get_int(tc, "vocab_size", where, 1, 1, MAX_VOCAB, &c->vocab))
        return DFL_ERR;
    if (moe && parse_moe(c, tc, where, c->arch == DFL_ARCH_QWEN3_5)) return DFL_ERR;
    /* Tied embeddings: top level and text_config may both say; they must agree. */
    int tie_top = 0, tie_text = 0, has_top = 0, has_text = 0;
    if (get_bool(root, "tie_word_embeddings", where, &tie_top, &has_top)) return DFL_ERR;
    if (tc != root && get_bool(tc, "tie_word_embeddings", where, &tie_text, &has_text)) return DFL_ERR;
    if (has_top && has_text && tie_top != tie_text) {
        dfl_seterr("%s: tie_word_embeddings is %s at top level but %s in text_config", where,
                   tie_top ? "true" : "false", tie_text ? "true" : "false");
        return DFL_ERR;
    }
    c->tie_embeddings = has_text ? tie_text : tie_top;
    if (c->arch == DFL_ARCH_QWEN3_5) {
        int interval = 4;
        c->lin_k_heads = 16, c->lin_v_heads = 32, c->lin_k_dim = 128, c->lin_v_dim = 128, c->conv_kernel = 4;
        /* the conv window and the state kernels hold at most 16 taps and 512-wide heads */
        if (get_int(tc, "full_attention_interval", where, 0, 1, DFL_MAX_LAYERS, &interval) ||
            get_int(tc, "linear_num_key_heads", where, 0, 1, MAX_HEADS, &c->lin_k_heads) ||
            get_int(tc, "linear_num_value_heads", where, 0, 1, MAX_HEADS, &c->lin_v_heads) ||
            get_int(tc, "linear_key_head_dim", where, 0, 1, 512, &c->lin_k_dim) ||
            get_int(tc, "linear_value_head_dim", where, 0, 1, 512, &c->lin_v_dim) ||
            get_int(tc, "linear_conv_kernel_dim", where, 0, 1, 16, &c->conv_kernel))
            return DFL_ERR;
        c->mtp_layers = 1;
        if (get_int(tc, "mtp_num_hidden_layers", where, 0, 0, DFL_MAX_LAYERS, &c->mtp_layers)) return DFL_ERR;
        if (c->lin_v_heads % c->lin_k_heads) {
            dfl_seterr("%s: linear_num_value_heads (%d) is not a multiple of linear_num_key_heads (%d)", where,
                       c->lin_v_heads, c->lin_k_heads);
            return DFL_ERR;
        }
        if (parse_layer_types(c, tc, where, interval)) return DFL_ERR;
        for (int i = 0; i < c->n_layers; i++)
            if (c->layer_types[i] == DFL_LAYER_SLIDING) {
                dfl_seterr("%s: layer_types[%d] = sliding_attention is not a Qwen3.5 layer type", where, i);
                return DFL_ERR;
            }
    } else {
        for (int i = 0; i < c->n_layers; i++) c->layer_types[i] = DFL_LAYER_FULL;
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
        if (cJSON_IsTrue(sw)) {
            dfl_seterr("%s: use_sliding_window = true is not supported for qwen3 targets", where);
            return DFL_ERR;
        }
    }
    if (parse_eos(c, tc, where) || (tc != root && parse_eos(c, root, where))) return DFL_ERR;
    return DFL_OK;
}

int config_parse(dfl_config *c, const char *json, const char *where) {
    memset(c, 0, sizeof *c);
    /* trailing text after the object is an error, as in Python's json.load */
    cJSON *root = cJSON_ParseWithOpts(json, NULL, 1);
    if (!root)
        return dfl_seterr("%s: not valid JSON (near byte %ld)", where,
                          cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - json) : -1L);
    const int rc = parse_root(c, root, where);
    cJSON_Delete(root);
    return rc;
}

int config_load(dfl_config *c, const char *dir) {
    char *path = dfl_path_join(dir, "config.json");
    char *text = dfl_read_file(path, NULL);
    if (!text) {
        free(path);
        return DFL_ERR;
    }
    int rc = config_parse(c, text, path);
    free(text);
    free(path);
    return rc;
}

/* An optional JSON object file: DFL_OK with *out NULL when the file is absent. */
static int load_optional(const char *path, cJSON **out) {
    *out = NULL;
    if (!dfl_is_file(path)) return DFL_OK;
    char *text = dfl_read_file(path, NULL);
    if (!text) return DFL_ERR;
    *out = cJSON_ParseWithOpts(text, NULL, 1);
    long at = *out || !cJSON_GetErrorPtr() ? -1L : (long)(cJSON_GetErrorPtr() - text);
    free(text);
    if (!*out) return dfl_seterr("%s: not valid JSON (near byte %ld)", path, at);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return dfl_seterr("%s: not a JSON object", path);
    }
    return DFL_OK;
}

/* tokenizer_config.json: eos_token (a string or {"content": ...}) mapped to its id through
 * added_tokens_decoder, whose keys are the ids as strings. */
static int tokenizer_config_eos(dfl_config *c, const cJSON *j, const char *where) {
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "eos_token");
    if (cJSON_IsObject(tok)) tok = cJSON_GetObjectItemCaseSensitive(tok, "content");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(j, "added_tokens_decoder");
    if (!cJSON_IsString(tok) || !cJSON_IsObject(dec)) return DFL_OK;
    const cJSON *x;
    cJSON_ArrayForEach(x, dec) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!cJSON_IsString(content) || strcmp(content->valuestring, tok->valuestring) != 0) continue;
        /* the key is text: all digits and below the vocabulary, checked before the cast */
        char *end;
        const unsigned long long id = strtoull(x->string, &end, 10);
        if (!isdigit((unsigned char)x->string[0]) || *end || id >= (unsigned long long)c->vocab)
            return dfl_seterr("%s: added_tokens_decoder key of the eos token '%s': expected an integer in [0, "
                              "vocab_size = %d), found '%s'",
                              where, tok->valuestring, c->vocab, x->string);
        if (add_eos(c, (int)id, where, "eos_token")) return DFL_ERR;
    }
    return DFL_OK;
}

int config_load_eos(dfl_config *c, const char *dir) {
    static const char *const files[] = {"generation_config.json", "tokenizer_config.json"};
    for (int f = 0; f < 2; f++) {
        char *path = dfl_path_join(dir, files[f]);
        cJSON *j;
        int rc = load_optional(path, &j);
        if (rc == DFL_OK && j) rc = f == 0 ? parse_eos(c, j, path) : tokenizer_config_eos(c, j, path);
        cJSON_Delete(j);
        free(path);
        if (rc) return DFL_ERR;
    }
    return DFL_OK;
}
