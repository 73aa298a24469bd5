/* Checkpoint anatomy (include/dfl/inspect.h): the reports dfl inspect prints and the Python API
 * returns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/drafter.h"
#include "dfl/inspect.h"
#include "dfl/model.h"
#include "dfl/mtp.h"

static void dtype_counts(const st_checkpoint *st, const unsigned char *used, int counts[ST_DTYPE_COUNT]) {
    memset(counts, 0, sizeof(int) * ST_DTYPE_COUNT);
    for (int i = 0; i < st->n_tensors; i++)
        if (!used || used[i]) counts[st->tensors[i].dtype]++;
}

static void print_dtypes_text(FILE *f, const int counts[ST_DTYPE_COUNT]) {
    int first = 1;
    for (int d = 0; d < ST_DTYPE_COUNT; d++)
        if (counts[d]) {
            fprintf(f, "%s%s x%d", first ? "" : ", ", st_dtype_name((st_dtype)d), counts[d]);
            first = 0;
        }
    fprintf(f, "\n");
}

static void print_dtypes_json(FILE *f, const int counts[ST_DTYPE_COUNT]) {
    fprintf(f, "{");
    int first = 1;
    for (int d = 0; d < ST_DTYPE_COUNT; d++)
        if (counts[d]) {
            fprintf(f, "%s\"%s\": %d", first ? "" : ", ", st_dtype_name((st_dtype)d), counts[d]);
            first = 0;
        }
    fprintf(f, "}");
}

static uint64_t total_bytes(const st_checkpoint *st) {
    uint64_t b = 0;
    for (int i = 0; i < st->n_tensors; i++) b += st->tensors[i].nbytes;
    return b;
}

/* Tensors the forward reads, by role in a fine-grained FP8 checkpoint: F8_E4M3 weights, their
 * weight_scale_inv, and everything left unquantized. */
typedef struct quant_counts {
    int n[3];
    uint64_t bytes[3];
} quant_counts;

static quant_counts count_quant(const dfl_model *m) {
    quant_counts q = {{0}, {0}};
    for (int i = 0; i < m->st.n_tensors; i++) {
        if (!m->used[i]) continue;
        const st_tensor *t = &m->st.tensors[i];
        const size_t len = strlen(t->name);
        const int k = t->dtype == ST_F8_E4M3 ? 0 : len > 10 && strcmp(t->name + len - 10, "_scale_inv") == 0 ? 1 : 2;
        q.n[k]++;
        q.bytes[k] += t->nbytes;
    }
    return q;
}

static void quant_json(FILE *f, const dfl_model *m) {
    const dfl_quant *q = &m->quant;
    if (!q->present) {
        fprintf(f, "null");
        return;
    }
    const quant_counts k = count_quant(m);
    fprintf(
        f,
        "{\"quant_method\": \"%s\", \"fmt\": \"%s\", \"activation_scheme\": \"%s\", \"weight_block_size\": [%d, %d], "
        "\"modules_to_not_convert\": [",
        q->method, q->fmt, q->activation, q->block_rows, q->block_cols);
    for (int i = 0; i < q->n_not_convert; i++) {
        fprintf(f, "%s", i ? ", " : "");
        dfl_json_write_string(f, q->not_convert[i]);
    }
    fprintf(f,
            "], \"quantized_weights\": %d, \"quantized_bytes\": %llu, \"scale_tensors\": %d, \"scale_bytes\": %llu, "
            "\"unquantized_tensors\": %d, \"unquantized_bytes\": %llu}",
            k.n[0], (unsigned long long)k.bytes[0], k.n[1], (unsigned long long)k.bytes[1], k.n[2],
            (unsigned long long)k.bytes[2]);
}

static void quant_text(FILE *f, const dfl_model *m) {
    const dfl_quant *q = &m->quant;
    if (!q->present) {
        fprintf(f, "quantization: none\n");
        return;
    }
    const quant_counts k = count_quant(m);
    fprintf(f,
            "quantization: %s (fmt %s: F8_E4M3 weights), weight_block_size %d x %d, activation_scheme %s (dfl "
            "dequantizes the "
            "weights in its kernels; activations stay float32), %d modules_to_not_convert\n",
            q->method, q->fmt, q->block_rows, q->block_cols, q->activation, q->n_not_convert);
    fprintf(f, "  quantized    %4d F8_E4M3 weights %10.2f MB + %d weight_scale_inv %.2f MB\n", k.n[0], k.bytes[0] / 1e6,
            k.n[1], k.bytes[1] / 1e6);
    fprintf(f, "  unquantized  %4d tensors         %10.2f MB (embeddings, lm_head, norms, modules_to_not_convert)\n",
            k.n[2], k.bytes[2] / 1e6);
}

static void layer_types_json(FILE *f, const dfl_config *c) {
    fprintf(f, "[");
    for (int i = 0; i < c->n_layers; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "", config_layer_type_name(c->layer_types[i]));
    fprintf(f, "]");
}

/* Parameters the forward reads (total) and those one token uses: a token runs k of the E routed
 * experts of every sparse layer, so active = total - (E - k) x one expert's parameters per layer. */
static void param_counts(const dfl_model *m, uint64_t *total, uint64_t *active) {
    *total = 0;
    for (int i = 0; i < m->st.n_tensors; i++)
        if (m->used[i]) *total += (uint64_t)m->st.tensors[i].numel;
    *active = *total - (uint64_t)(m->cfg.n_experts - m->cfg.n_experts_per_tok) * m->expert_params;
}

static int expert_layout_fused(const dfl_model *m) {
    for (int i = 0; i < m->cfg.n_layers; i++)
        if (m->layers[i].moe) return m->layers[i].exp_fused;
    return 0;
}

static int inspect_target(FILE *f, const char *dir, int json, int check) {
    dfl_model m;
    if (model_open(&m, dir, check) != DFL_OK) return DFL_ERR;
    const dfl_config *c = &m.cfg;
    char pattern[DFL_MAX_LAYERS + 1];
    config_layer_pattern(c, pattern, sizeof pattern);
    int n_lin = 0;
    for (int i = 0; i < c->n_layers; i++) n_lin += c->layer_types[i] == DFL_LAYER_LINEAR;
    int dt[ST_DTYPE_COUNT];
    dtype_counts(&m.st, m.used, dt);
    int n_unused[DFL_COMP_COUNT] = {0};
    for (int i = 0; i < m.st.n_tensors; i++)
        if (!m.used[i]) n_unused[model_component(&m, m.st.tensors[i].name)]++;
    uint64_t p_total, p_active;
    param_counts(&m, &p_total, &p_active);
    const int n_sparse = config_n_moe_layers(c);
    /* the drafters the checkpoint offers: its MTP head, when its tensors load for this target */
    const int n_mtp = mtp_count_tensors(&m.st);
    int mtp_ok = 0;
    char mtp_why[1024] = "";
    if (n_mtp) {
        dfl_mtp h;
        mtp_ok = mtp_open(&h, dir, &m, check) == DFL_OK;
        if (mtp_ok) mtp_close(&h);
        else snprintf(mtp_why, sizeof mtp_why, "%s", dfl_errmsg());
    }
    if (json) {
        fprintf(f, "{\"path\": ");
        dfl_json_write_string(f, dir);
        fprintf(f, ", \"layout\": \"%s\", \"prefix\": ", model_layout_name(m.layout));
        dfl_json_write_string(f, m.prefix);
        fprintf(f, ", \"architecture\": \"%s\", \"model_type\": ", config_arch_name(c->arch));
        dfl_json_write_string(f, c->model_type);
        fprintf(f, ", \"architectures\": ");
        dfl_json_write_string(f, c->architecture);
        fprintf(f, ", \"text_config\": %s, \"num_layers\": %d, \"layer_types\": ", c->text_config ? "true" : "false",
                c->n_layers);
        layer_types_json(f, c);
        fprintf(f,
                ", \"layer_pattern\": \"%s\", \"hidden_size\": %d, \"intermediate_size\": %d, \"vocab_size\": %d, "
                "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"rope_theta\": %g, "
                "\"partial_rotary_factor\": %g, \"rotary_dim\": %d, \"rms_norm_eps\": %g, \"tie_word_embeddings\": %s",
                pattern, c->hidden, c->intermediate, c->vocab, c->n_heads, c->n_kv_heads, c->head_dim, c->rope_theta,
                c->partial_rotary, c->rot_dim, c->rms_eps, c->tie_embeddings ? "true" : "false");
        if (c->arch == DFL_ARCH_QWEN3_5)
            fprintf(f,
                    ", \"linear_attention\": {\"key_heads\": %d, \"value_heads\": %d, \"key_head_dim\": %d, "
                    "\"value_head_dim\": %d, \"conv_kernel\": %d}",
                    c->lin_k_heads, c->lin_v_heads, c->lin_k_dim, c->lin_v_dim, c->conv_kernel);
        fprintf(f, ", \"parameters\": {\"total\": %llu, \"active\": %llu}, \"moe\": ", (unsigned long long)p_total,
                (unsigned long long)p_active);
        if (c->n_experts > 0)
            fprintf(f,
                    "{\"experts\": %d, \"experts_per_tok\": %d, \"moe_intermediate_size\": %d, \"norm_topk_prob\": %s, "
                    "\"shared_expert\": %s, \"shared_expert_intermediate_size\": %d, \"sparse_layers\": %d, "
                    "\"dense_layers\": %d, \"expert_layout\": \"%s\"}",
                    c->n_experts, c->n_experts_per_tok, c->moe_intermediate, c->norm_topk_prob ? "true" : "false",
                    c->shared_intermediate > 0 ? "true" : "false", c->shared_intermediate, n_sparse,
                    c->n_layers - n_sparse, expert_layout_fused(&m) ? "fused" : "per_expert");
        else fprintf(f, "null");
        fprintf(f, ", \"dtypes\": ");
        print_dtypes_json(f, dt);
        fprintf(f, ", \"quantization\": ");
        quant_json(f, &m);
        fprintf(f, ", \"tensors\": {");
        for (int k = 0; k < DFL_COMP_COUNT; k++)
            fprintf(f, "%s\"%s\": %d", k ? ", " : "", model_component_name((dfl_component)k), m.comp_count[k]);
        fprintf(f, "}, \"tensor_bytes\": {");
        for (int k = 0; k < DFL_COMP_COUNT; k++)
            fprintf(f, "%s\"%s\": %llu", k ? ", " : "", model_component_name((dfl_component)k),
                    (unsigned long long)m.comp_bytes[k]);
        fprintf(f, "}, \"n_tensors\": %d, \"bytes\": %llu, \"used_bytes\": %llu, \"files\": %d, \"unused\": {",
                m.st.n_tensors, (unsigned long long)total_bytes(&m.st), (unsigned long long)m.weight_bytes,
                m.st.n_files);
        for (int k = 0; k < DFL_COMP_COUNT; k++) {
            fprintf(f, "%s\"%s\": [", k ? ", " : "", model_component_name((dfl_component)k));
            int first = 1;
            for (int i = 0; i < m.st.n_tensors; i++)
                if (!m.used[i] && model_component(&m, m.st.tensors[i].name) == (dfl_component)k) {
                    fprintf(f, "%s", first ? "" : ", ");
                    dfl_json_write_string(f, m.st.tensors[i].name);
                    first = 0;
                }
            fprintf(f, "]");
        }
        fprintf(f, "}, \"eos_token_ids\": [");
        for (int i = 0; i < m.n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", m.eos_ids[i]);
        fprintf(f, "], \"mtp\": {\"tensors\": %d, \"num_hidden_layers\": %d, \"usable\": %s, \"error\": ", n_mtp,
                c->mtp_layers, mtp_ok ? "true" : "false");
        if (n_mtp && !mtp_ok) dfl_json_write_string(f, mtp_why);
        else fprintf(f, "null");
        fprintf(f, "}, \"drafters\": [%s]}\n", mtp_ok ? "\"mtp\"" : "");
    } else {
        fprintf(f, "checkpoint:   %s (%d file%s)\n", dir, m.st.n_files, m.st.n_files == 1 ? "" : "s");
        fprintf(f, "layout:       %s — text tensors under '%s'%s\n", model_layout_name(m.layout), m.prefix,
                m.layout == DFL_LAYOUT_VLM ? " (vision-language checkpoint; only the text model is loaded)" : "");
        fprintf(f, "config:       model_type %s%s%s%s\n", c->model_type,
                c->text_config ? ", text settings from text_config" : "", c->architecture[0] ? ", architectures " : "",
                c->architecture);
        fprintf(f, "architecture: %s%s\n",
                c->arch == DFL_ARCH_QWEN3 ? (c->n_experts ? "qwen3 attention" : "qwen3 dense")
                                          : "qwen3_5 hybrid (Gated DeltaNet + gated attention)",
                c->n_experts ? ", sparse mixture of experts" : "");
        fprintf(f, "layers:       %d  %s  (%d linear_attention, %d full_attention)\n", c->n_layers, pattern, n_lin,
                c->n_layers - n_lin);
        if (c->intermediate)
            fprintf(f, "sizes:        hidden %d, intermediate %d, vocab %d\n", c->hidden, c->intermediate, c->vocab);
        else /* every layer sparse (qwen3_5_moe) */
            fprintf(f, "sizes:        hidden %d, no dense MLP, vocab %d\n", c->hidden, c->vocab);
        fprintf(f, "attention:    %d q heads / %d kv heads, head_dim %d, rope theta %g, rotary %d of %d dims%s\n",
                c->n_heads, c->n_kv_heads, c->head_dim, c->rope_theta, c->rot_dim, c->head_dim,
                c->attn_gate ? ", output gate" : "");
        if (c->arch == DFL_ARCH_QWEN3_5)
            fprintf(f, "linear attn:  %d key heads / %d value heads, key dim %d, value dim %d, conv kernel %d\n",
                    c->lin_k_heads, c->lin_v_heads, c->lin_k_dim, c->lin_v_dim, c->conv_kernel);
        if (c->n_experts > 0) {
            fprintf(f, "experts:      %d routed, top-%d per token (softmax, top-k%s), expert inner size %d",
                    c->n_experts, c->n_experts_per_tok,
                    c->norm_topk_prob ? " renormalised to sum 1" : ", not renormalised", c->moe_intermediate);
            if (c->shared_intermediate > 0)
                fprintf(f, "; shared expert inner size %d, sigmoid-gated", c->shared_intermediate);
            fprintf(f, "\n              %d of %d layers sparse%s, experts stored %s\n", n_sparse, c->n_layers,
                    n_sparse < c->n_layers ? " (others dense MLP)" : "",
                    expert_layout_fused(&m) ? "fused (mlp.experts.gate_up_proj / down_proj)"
                                            : "per expert (mlp.experts.{e}.*_proj)");
        }
        fprintf(f, "parameters:   %.4g M read by the forward", p_total / 1e6);
        if (c->n_experts > 0)
            fprintf(f, ", %.4g M active per token (%d of %d experts per sparse layer)", p_active / 1e6,
                    c->n_experts_per_tok, c->n_experts);
        fprintf(f, "\n");
        fprintf(f, "embeddings:   %s\n",
                c->tie_embeddings ? "tied (lm_head = embed_tokens)" : "untied (lm_head.weight)");
        fprintf(f, "dtypes used:  ");
        print_dtypes_text(f, dt);
        quant_text(f, &m);
        fprintf(f, "tensors:      %d in all, %.2f MB; used by the forward: %.2f MB\n", m.st.n_tensors,
                total_bytes(&m.st) / 1e6, m.weight_bytes / 1e6);
        for (int k = 0; k < DFL_COMP_COUNT; k++)
            fprintf(f, "  %-7s %6d tensors %12.2f MB%s\n", model_component_name((dfl_component)k), m.comp_count[k],
                    m.comp_bytes[k] / 1e6, n_unused[k] ? "  (not used by the text forward)" : "");
        for (int k = 0; k < DFL_COMP_COUNT; k++) {
            if (!n_unused[k]) continue;
            fprintf(f, "unused %s tensors (%d):", model_component_name((dfl_component)k), n_unused[k]);
            int shown = 0;
            for (int i = 0; i < m.st.n_tensors && shown < 6; i++)
                if (!m.used[i] && model_component(&m, m.st.tensors[i].name) == (dfl_component)k) {
                    fprintf(f, "%s %s", shown ? "," : "", m.st.tensors[i].name);
                    shown++;
                }
            fprintf(f, "%s\n", n_unused[k] > shown ? ", ... (--json lists all)" : "");
        }
        if (mtp_ok)
            fprintf(f,
                    "drafters:     mtp — the checkpoint's own MTP head (%d layer, %d mtp.* tensors): --drafter mtp\n",
                    c->mtp_layers, n_mtp);
        else if (n_mtp)
            fprintf(f, "drafters:     none — %d mtp.* tensors, but no usable MTP head: %s\n", n_mtp, mtp_why);
        else fprintf(f, "drafters:     none — no MTP head (no mtp.* tensors)\n");
        if (check) fprintf(f, "weights:      every tensor the forward reads is finite (--check-weights)\n");
        fprintf(f, "eos ids:      ");
        for (int i = 0; i < m.n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", m.eos_ids[i]);
        fprintf(f, "%s\n", m.n_eos ? "" : "(none)");
    }
    model_close(&m);
    return DFL_OK;
}

static int inspect_drafter(FILE *f, FILE *log, const char *dir, const char *target_dir, int json, int check,
                           int *compatible) {
    dfl_model t;
    int have_target = 0;
    if (target_dir) {
        if (model_open(&t, target_dir, check) != DFL_OK) return DFL_ERR;
        have_target = 1;
    }
    dfl_drafter d;
    if (drafter_open_checked(&d, dir, have_target ? t.cfg.n_layers : 0, check) != DFL_OK) {
        if (have_target) model_close(&t);
        return DFL_ERR;
    }
    const dfl_config *c = &d.cfg;
    int compat = DFL_OK;
    const char *why = "", *warning = NULL;
    char whybuf[4096], warnbuf[1024];
    if (have_target) {
        compat = drafter_check_target(&d, &t);
        snprintf(whybuf, sizeof whybuf, "%s", dfl_errmsg());
        why = whybuf;
        warning = drafter_target_warning(&d, &t, warnbuf, sizeof warnbuf);
        if (warning && log) fprintf(log, "dfl: warning: %s\n", warning);
    }
    char pattern[DFL_MAX_LAYERS + 1];
    config_layer_pattern(c, pattern, sizeof pattern);
    int dt[ST_DTYPE_COUNT];
    dtype_counts(&d.st, d.used, dt);
    int n_unused = 0;
    for (int i = 0; i < d.st.n_tensors; i++) n_unused += !d.used[i];
    if (json) {
        fprintf(f, "{\"path\": ");
        dfl_json_write_string(f, dir);
        fprintf(f, ", \"layout\": \"drafter\", \"prefix\": ");
        dfl_json_write_string(f, d.prefix);
        fprintf(f,
                ", \"architecture\": \"%s\", \"num_layers\": %d, \"layer_types\": ", c->dflash2 ? "dflash2" : "dflash",
                c->n_layers);
        layer_types_json(f, c);
        fprintf(f,
                ", \"layer_pattern\": \"%s\", \"sliding_window\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
                "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"rope_theta\": %g, "
                "\"block_size\": %d, \"mask_token_id\": %d, \"target_layer_ids\": [",
                pattern, c->sliding_window, c->hidden, c->intermediate, c->n_heads, c->n_kv_heads, c->head_dim,
                c->rope_theta, c->block_size, c->mask_token_id);
        for (int i = 0; i < c->n_target_ids; i++) fprintf(f, "%s%d", i ? ", " : "", c->target_layer_ids[i]);
        fprintf(f, "], \"target_layer_ids_source\": \"%s\", \"hidden_states_indices\": [",
                c->target_ids_default ? "default formula" : "config");
        for (int i = 0; i < c->n_target_ids; i++) fprintf(f, "%s%d", i ? ", " : "", c->target_layer_ids[i] + 1);
        fprintf(f, "]");
        if (c->dflash2)
            fprintf(f,
                    ", \"dflash2\": {\"conv_kernel_size\": %d, \"conv_group_size\": %d, \"selector_rank\": %d, "
                    "\"selector_top_k\": %d, \"is_causal\": %s}",
                    c->conv_taps, c->conv_group, c->selector_rank, c->selector_top_k,
                    c->causal < 0 ? "null"
                    : c->causal   ? "true"
                                  : "false");
        fprintf(f, ", \"block_attention\": ");
        drafter_attn_json(f, &d);
        fprintf(f, ", \"dtypes\": ");
        print_dtypes_json(f, dt);
        fprintf(f,
                ", \"tensors\": {\"text\": 0, \"vision\": 0, \"mtp\": 0, \"other\": %d, \"drafter\": %d}, "
                "\"n_tensors\": %d, \"bytes\": %llu",
                n_unused, d.st.n_tensors - n_unused, d.st.n_tensors, (unsigned long long)total_bytes(&d.st));
        if (have_target) {
            fprintf(f, ", \"target\": ");
            dfl_json_write_string(f, target_dir);
            fprintf(f, ", \"compatible\": %s, \"incompatibility\": ", compat == DFL_OK ? "true" : "false");
            dfl_json_write_string(f, compat == DFL_OK ? "" : why);
            fprintf(f, ", \"warning\": ");
            dfl_json_write_string(f, warning ? warning : "");
        }
        fprintf(f, "}\n");
    } else {
        fprintf(f, "checkpoint:   %s\n", dir);
        fprintf(f, "layout:       drafter (%s, tensors under '%s')\n", c->dflash2 ? "DFlash2" : "DFlash",
                d.prefix[0] ? d.prefix : "(no prefix)");
        fprintf(f, "layers:       %d  %s%s", c->n_layers, pattern, c->sliding_window ? "" : "\n");
        if (c->sliding_window) fprintf(f, "  (sliding window %d)\n", c->sliding_window);
        fprintf(f, "sizes:        hidden %d, intermediate %d; %d q heads / %d kv heads, head_dim %d, rope theta %g\n",
                c->hidden, c->intermediate, c->n_heads, c->n_kv_heads, c->head_dim, c->rope_theta);
        fprintf(f, "block size:   %d   mask token id: %d\n", c->block_size, c->mask_token_id);
        fprintf(f, "block attn:   %s [mode %s]\n", drafter_attn_semantics(&d), drafter_causal_name(c->causal));
        if (c->dflash2)
            fprintf(f,
                    "dflash2:      grouped conv of %d taps, groups of %d channels; selector rank %d over the top %d "
                    "candidates\n",
                    c->conv_taps, c->conv_group, c->selector_rank, c->selector_top_k);
        fprintf(f, "target layers:");
        for (int i = 0; i < c->n_target_ids; i++) fprintf(f, " %d", c->target_layer_ids[i]);
        fprintf(f, "  (%s) = output of those decoder layers = transformers hidden_states[",
                c->target_ids_default ? "default formula" : "from config");
        for (int i = 0; i < c->n_target_ids; i++) fprintf(f, "%s%d", i ? ", " : "", c->target_layer_ids[i] + 1);
        fprintf(f, "]\n");
        fprintf(f, "dtypes used:  ");
        print_dtypes_text(f, dt);
        fprintf(f, "tensors:      %d (%.2f MB), %d not used\n", d.st.n_tensors, total_bytes(&d.st) / 1e6, n_unused);
        if (check) fprintf(f, "weights:      every tensor the forward reads is finite (--check-weights)\n");
        if (have_target) {
            if (compat == DFL_OK)
                fprintf(f, "target:       %s — compatible (hidden %d, vocab %d, %d layers, mask id < vocab)\n",
                        target_dir, t.cfg.hidden, t.cfg.vocab, t.cfg.n_layers);
            else fprintf(f, "target:       %s — NOT compatible: %s\n", target_dir, why);
            if (warning) fprintf(f, "warning:      %s\n", warning);
        }
    }
    drafter_close(&d);
    if (have_target) model_close(&t);
    *compatible = compat == DFL_OK;
    return DFL_OK;
}

int model_inspect(FILE *f, FILE *log, const char *dir, const char *target, int json, int check, int *compatible) {
    *compatible = 1;
    dfl_config c;
    if (config_load(&c, dir) != DFL_OK) return DFL_ERR;
    if (c.arch == DFL_ARCH_DFLASH) return inspect_drafter(f, log, dir, target, json, check, compatible);
    if (target) return dfl_seterr("target: applies to drafters only; %s is a target model", dir);
    return inspect_target(f, dir, json, check);
}
