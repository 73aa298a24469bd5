/* config.json parsing: architectures, nested/top-level rope, layer types, drafter fields,
 * mixture-of-experts fields (which layers are sparse, transformers' defaults), range checks of
 * every integer field, eos ids from the other config files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dfl/common.h"
#include "dfl/config.h"
#include "testutil.h"

static int parse(dfl_config *c, const char *json) { return config_parse(c, json, "config.json"); }

#define QWEN3_BASE                                                                                    \
    "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128," \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":100"
#define DRAFTER_BASE                                                                        \
    "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":2," \
    "\"intermediate_size\":128,\"num_attention_heads\":4,\"block_size\":8"

/* The base config with `extra` fields added must be refused with a message holding `needle`. */
static void refused(const char *base, const char *extra, const char *needle) {
    char json[1024];
    dfl_config c;
    snprintf(json, sizeof json, "%s,%s}", base, extra);
    int rc = parse(&c, json);
    CHECK(rc == DFL_ERR && strstr(dfl_errmsg(), needle), "%s: expected an error with '%s', got %s", extra, needle,
          rc == DFL_OK ? "success" : dfl_errmsg());
}

/* Out-of-range and non-integral numbers are refused on the double, before any cast (these cast
 * first used to be undefined behaviour, and a huge eos id was accepted). */
static void test_ranges(void) {
    dfl_config c;
    refused(QWEN3_BASE, "\"eos_token_id\":9e98",
            "config.json: eos_token_id: expected an integer in [0, vocab_size = 100), found 9e+98");
    refused(QWEN3_BASE, "\"eos_token_id\":100",
            "eos_token_id: expected an integer in [0, vocab_size = 100), found 100");
    refused(QWEN3_BASE, "\"eos_token_id\":-1", "found -1");
    refused(QWEN3_BASE, "\"eos_token_id\":[5,2.5]",
            "eos_token_id[1]: expected an integer in [0, vocab_size = 100), found 2.5");
    refused(QWEN3_BASE, "\"eos_token_id\":[5,\"x\"]",
            "eos_token_id[1]: expected an integer in [0, vocab_size = 100), found \"x\"");
    refused(QWEN3_BASE, "\"eos_token_id\":[1,2,3,4,5,6,7,8,9]", "more than 8 distinct eos ids");
    CHECK(parse(&c, QWEN3_BASE ",\"eos_token_id\":[99,7,99,0]}") == DFL_OK && c.n_eos == 3 && c.eos_ids[0] == 99 &&
              c.eos_ids[2] == 0,
          "eos ids at the bounds, repeats dropped: %s", dfl_errmsg());
    CHECK(parse(&c, QWEN3_BASE ",\"eos_token_id\":null}") == DFL_OK && c.n_eos == 0, "eos null: %s", dfl_errmsg());
    CHECK(parse(&c, QWEN3_BASE "} x") == DFL_ERR && strstr(dfl_errmsg(), "not valid JSON"), "trailing text: %s",
          dfl_errmsg());
    refused(QWEN3_BASE, "\"head_dim\":64", "key 'head_dim' appears twice");
    refused(QWEN3_BASE, "\"rope_parameters\":{\"rope_theta\":1,\"rope_theta\":2}", "key 'rope_theta' appears twice");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":1e30", "\"num_hidden_layers\":2",
            "hidden_size: expected an integer in [1, 65536], found 1e+30");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":64.5", "\"num_hidden_layers\":2",
            "hidden_size: expected an integer in [1, 65536], found 64.5");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":1e999", "\"num_hidden_layers\":2", "found inf");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":-1e999", "\"num_hidden_layers\":2", "found -inf");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":300", "\"intermediate_size\":1",
            "num_hidden_layers: expected an integer in [1, 256], found 300");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":0", "\"intermediate_size\":1",
            "num_hidden_layers: expected an integer in [1, 256], found 0");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
            "\"num_attention_heads\":4,\"vocab_size\":100",
            "\"head_dim\":1024", "head_dim: expected an integer in [1, 512], found 1024");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":2048,\"num_hidden_layers\":2,\"intermediate_size\":8,"
            "\"num_attention_heads\":2,\"vocab_size\":10",
            "\"rope_theta\":1e4", "head_dim = hidden_size / num_attention_heads = 1024 exceeds the supported 512");
    refused(QWEN3_BASE, "\"max_position_embeddings\":4e9", "max_position_embeddings: expected an integer");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
            "\"num_attention_heads\":4,\"vocab_size\":100",
            "\"num_key_value_heads\":0", "num_key_value_heads: expected an integer in [1, 1024], found 0");
    refused(QWEN3_BASE, "\"rms_norm_eps\":-1", "rms_norm_eps: expected a number in [0, 1], found -1");
    refused(QWEN3_BASE, "\"rope_theta\":1e999", "rope_theta: expected a number in [0, 1e+30], found inf");
    refused("{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
            "\"num_attention_heads\":4,\"vocab_size\":1e10",
            "\"rope_theta\":1e4", "vocab_size: expected an integer in [1, 16777216], found 10000000000");
    const char *q35 = "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,\"num_hidden_layers\":4,"
                      "\"intermediate_size\":128,\"num_attention_heads\":4,\"vocab_size\":10";
    refused(q35, "\"linear_conv_kernel_dim\":17", "linear_conv_kernel_dim: expected an integer in [1, 16], found 17");
    refused(q35, "\"linear_key_head_dim\":1e20", "linear_key_head_dim: expected an integer in [1, 512], found 1e+20");
    refused(q35, "\"full_attention_interval\":0", "full_attention_interval: expected an integer in [1, 256], found 0");
    /* drafters */
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"target_layer_ids\":[1e999]",
            "target_layer_ids[0]: expected an integer in [0, 255], found inf");
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"target_layer_ids\":[0,1.5]",
            "target_layer_ids[1]: expected an integer in [0, 255], found 1.5");
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"target_layer_ids\":[0,-1]", "target_layer_ids[1]");
    refused(DRAFTER_BASE, "\"vocab_size\":1000,\"mask_token_id\":1000",
            "mask_token_id: expected an integer in [0, vocab_size = 1000), found 1000");
    refused(DRAFTER_BASE, "\"mask_token_id\":9e98", "mask_token_id: expected an integer in [0, 16777215], found 9e+98");
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"num_target_layers\":1e9",
            "num_target_layers: expected an integer in [1, 256], found 1000000000");
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"sliding_window\":-2", "sliding_window: expected an integer");
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"dflash_config\":{\"block_size\":1e300}",
            "block_size: expected an integer in [2, 256], found 1e+300");
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"output_multiplier\":1e39", "output_multiplier: expected a number");
}

#define QWEN3_MOE_BASE                                                                                    \
    "{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4," \
    "\"vocab_size\":100,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32"

/* MoE configs: qwen3_moe's sparse layers (decoder_sparse_step, mlp_only_layers), num_experts
 * written as num_local_experts by transformers 5, qwen3_5_moe's defaults and shared expert. */
static void test_moe(void) {
    dfl_config c;
    CHECK(parse(&c, QWEN3_MOE_BASE ",\"num_local_experts\":8,\"intermediate_size\":96,\"decoder_sparse_step\":2,"
                                   "\"mlp_only_layers\":[3],\"norm_topk_prob\":true}") == DFL_OK,
          "qwen3_moe: %s", dfl_errmsg());
    CHECK(c.arch == DFL_ARCH_QWEN3 && c.n_experts == 8 && c.n_experts_per_tok == 2 && c.moe_intermediate == 32 &&
              c.shared_intermediate == 0 && c.norm_topk_prob && c.intermediate == 96 && !c.moe_layer[0] &&
              c.moe_layer[1] && !c.moe_layer[2] && !c.moe_layer[3] && config_n_moe_layers(&c) == 1,
          "qwen3_moe fields");
    CHECK(parse(&c, QWEN3_MOE_BASE ",\"num_experts\":8}") == DFL_OK && !c.norm_topk_prob &&
              config_n_moe_layers(&c) == 4 && c.intermediate == 0,
          "qwen3_moe, every layer sparse, no intermediate_size: %s", dfl_errmsg());
    refused(QWEN3_MOE_BASE, "\"num_experts\":8,\"mlp_only_layers\":[1]",
            "layer 1 has a dense MLP but intermediate_size is missing");
    refused(QWEN3_MOE_BASE, "\"num_experts\":1", "num_experts_per_tok 2 exceeds num_experts 1");
    refused(QWEN3_MOE_BASE, "\"num_experts\":8,\"num_local_experts\":6",
            "num_experts 8 and num_local_experts 6 disagree");
    refused(QWEN3_MOE_BASE, "\"num_experts\":8,\"mlp_only_layers\":[4]",
            "mlp_only_layers[0]: expected an integer in [0, num_hidden_layers = 4), found 4");
    refused(QWEN3_MOE_BASE, "\"num_experts\":8,\"decoder_sparse_step\":0",
            "decoder_sparse_step: expected an integer in [1,");
    CHECK(parse(&c, "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"hidden_size\":64,\"num_hidden_layers\":4,"
                    "\"num_attention_heads\":2,\"vocab_size\":100,\"num_experts\":16}}") == DFL_OK,
          "qwen3_5_moe: %s", dfl_errmsg());
    CHECK(c.arch == DFL_ARCH_QWEN3_5 && c.text_config && c.n_experts == 16 && c.n_experts_per_tok == 8 &&
              c.moe_intermediate == 512 && c.shared_intermediate == 512 && c.norm_topk_prob &&
              config_n_moe_layers(&c) == 4,
          "qwen3_5_moe defaults (transformers' Qwen3_5MoeTextConfig)");
    CHECK(parse(&c, "{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":64,\"num_hidden_layers\":4,"
                    "\"num_attention_heads\":2,\"vocab_size\":100,\"num_experts\":4,\"num_experts_per_tok\":1,"
                    "\"shared_expert_intermediate_size\":40}") == DFL_OK &&
              !c.text_config && c.n_experts_per_tok == 1 && c.shared_intermediate == 40,
          "qwen3_5_moe_text: %s", dfl_errmsg());
    /* qwen3_5_moe's num_local_experts must agree with num_experts too (it was ignored) */
    refused("{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":64,\"num_hidden_layers\":4,"
            "\"num_attention_heads\":2,\"vocab_size\":100",
            "\"num_experts\":4,\"num_local_experts\":8", "num_experts 4 and num_local_experts 8 disagree");
    CHECK(parse(&c, "{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":64,\"num_hidden_layers\":4,"
                    "\"num_attention_heads\":2,\"vocab_size\":100,\"num_local_experts\":16}") == DFL_OK &&
              c.n_experts == 16,
          "qwen3_5_moe: num_local_experts alone: %s", dfl_errmsg());
}

/* DFlash2: its four fields from dflash_config (z-lab) or the top level (speculators), is_causal,
 * and the refusals naming the field. */
#define DFLASH2_BASE                                                                               \
    "{\"architectures\":[\"DFlash2DraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":2,"       \
    "\"intermediate_size\":128,\"num_attention_heads\":4,\"vocab_size\":1000,\"mask_token_id\":5," \
    "\"target_layer_ids\":[0,2],\"block_size\":8"
static void test_dflash2(void) {
    dfl_config c;
    CHECK(parse(&c, DFLASH2_BASE ",\"is_causal\":false,\"dflash_config\":{\"conv_kernel_size\":2,"
                                 "\"conv_group_size\":16,\"selector_rank\":32,\"selector_top_k\":16}}") == DFL_OK &&
              c.arch == DFL_ARCH_DFLASH && c.dflash2 && c.conv_taps == 2 && c.conv_group == 16 &&
              c.selector_rank == 32 && c.selector_top_k == 16 && c.causal == 0,
          "dflash2 in dflash_config: %s", dfl_errmsg());
    CHECK(parse(&c, DFLASH2_BASE
                ",\"conv_kernel_size\":3,\"conv_group_size\":32,\"selector_rank\":8,"
                "\"selector_top_k\":4,\"dflash_config\":{\"causal\":true,\"selector_top_k\":6}}") == DFL_OK &&
              c.conv_taps == 3 && c.conv_group == 32 && c.selector_rank == 8 && c.selector_top_k == 6 && c.causal == 1,
          "dflash2 at top level, dflash_config first: %s", dfl_errmsg());
    CHECK(parse(&c, DRAFTER_BASE ",\"mask_token_id\":1}") == DFL_OK && !c.dflash2 && c.causal == -1 &&
              c.causal_field == DFL_CAUSAL_UNSET,
          "DFlash is not DFlash2: %s", dfl_errmsg());
    const char *four = "\"conv_group_size\":16,\"selector_rank\":8,\"selector_top_k\":4";
    char extra[512];
    snprintf(extra, sizeof extra, "%s", four);
    refused(DFLASH2_BASE, extra, "DFlash2DraftModel needs 'conv_kernel_size' (in dflash_config or at top level)");
    snprintf(extra, sizeof extra, "\"conv_kernel_size\":9,%s", four);
    refused(DFLASH2_BASE, extra, "conv_kernel_size: expected an integer in [1, 8], found 9");
    refused(DFLASH2_BASE, "\"conv_kernel_size\":2,\"conv_group_size\":48,\"selector_rank\":8,\"selector_top_k\":4",
            "conv_group_size 48 does not divide hidden_size 64");
    refused(DFLASH2_BASE, "\"conv_kernel_size\":2,\"conv_group_size\":16,\"selector_rank\":0,\"selector_top_k\":4",
            "selector_rank: expected an integer in [1, 65536], found 0");
    refused(DFLASH2_BASE, "\"conv_kernel_size\":2,\"conv_group_size\":16,\"selector_rank\":8,\"selector_top_k\":1001",
            "selector_top_k: expected an integer in [1, 1000], found 1001");
    refused(DFLASH2_BASE,
            "\"conv_kernel_size\":2,\"conv_group_size\":16,\"selector_rank\":8,\"selector_top_k\":4,"
            "\"is_causal\":1",
            "'is_causal' must be true or false");
    refused(
        DFLASH2_BASE,
        "\"conv_kernel_size\":2,\"conv_group_size\":16,\"selector_rank\":8,\"selector_top_k\":4,"
        "\"is_causal\":false,\"layer_types\":[\"full_attention\",\"sliding_attention\"],\"sliding_window\":4",
        "sliding_window 4 is smaller than block_size 8 in a non-causal (is_causal false) sliding_attention layer 1");
}

/* Plain DFlash reads the block attention as DFlash2 does: is_causal, then dflash_config.causal,
 * else -1 (sliding layers causal); the same refusals. */
static void test_dflash_causal(void) {
    dfl_config c;
    CHECK(parse(&c, DRAFTER_BASE ",\"mask_token_id\":1,\"is_causal\":true,\"dflash_config\":{\"causal\":false}}") ==
                  DFL_OK &&
              c.causal == 1 && c.causal_field == DFL_CAUSAL_IS_CAUSAL,
          "is_causal first: %s", dfl_errmsg());
    CHECK(parse(&c, DRAFTER_BASE ",\"is_causal\":null,\"dflash_config\":{\"mask_token_id\":1,\"causal\":false}}") ==
                  DFL_OK &&
              c.causal == 0 && c.causal_field == DFL_CAUSAL_DFLASH_CONFIG,
          "dflash_config.causal: %s", dfl_errmsg());
    CHECK(parse(&c, DRAFTER_BASE ",\"dflash_config\":{\"mask_token_id\":1,\"causal\":null}}") == DFL_OK &&
              c.causal == -1 && c.causal_field == DFL_CAUSAL_UNSET,
          "null is unset: %s", dfl_errmsg());
    refused(DRAFTER_BASE, "\"mask_token_id\":1,\"is_causal\":\"no\"",
            "config.json: field 'is_causal' must be true or false");
    refused(DRAFTER_BASE, "\"dflash_config\":{\"mask_token_id\":1,\"causal\":0}",
            "config.json: dflash_config: field 'causal' must be true or false");
    refused(DRAFTER_BASE,
            "\"mask_token_id\":1,\"layer_types\":[\"sliding_attention\",\"full_attention\"],"
            "\"sliding_window\":4,\"dflash_config\":{\"causal\":false}",
            "sliding_window 4 is smaller than block_size 8 in a non-causal (dflash_config.causal false) "
            "sliding_attention layer 0");
    CHECK(parse(&c, DRAFTER_BASE ",\"mask_token_id\":1,\"layer_types\":[\"sliding_attention\",\"full_attention\"],"
                                 "\"sliding_window\":4,\"is_causal\":true}") == DFL_OK &&
              c.causal == 1,
          "a causal window smaller than the block: %s", dfl_errmsg());
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* generation_config.json and tokenizer_config.json eos ids: checked like config.json's. */
static void test_extra_eos(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/eos", test_tmpdir());
    mkdir(dir, 0755);
    dfl_config c;
    CHECK(parse(&c, QWEN3_BASE ",\"eos_token_id\":7}") == DFL_OK, "base: %s", dfl_errmsg());
    CHECK(config_load_eos(&c, dir) == DFL_OK && c.n_eos == 1, "no extra files: %s", dfl_errmsg());
    write_text(dir, "generation_config.json", "{\"eos_token_id\": [7, 9]}");
    write_text(dir, "tokenizer_config.json",
               "{\"eos_token\": \"<e>\", \"added_tokens_decoder\": {\"98\": {\"content\": \"<x>\"}, "
               "\"99\": {\"content\": \"<e>\"}}}");
    CHECK(config_load_eos(&c, dir) == DFL_OK && c.n_eos == 3 && c.eos_ids[1] == 9 && c.eos_ids[2] == 99,
          "generation + tokenizer config: %s (%d ids)", dfl_errmsg(), c.n_eos);
    write_text(dir, "generation_config.json", "{\"eos_token_id\": 9e98}");
    CHECK(config_load_eos(&c, dir) == DFL_ERR &&
              strstr(dfl_errmsg(), "generation_config.json: eos_token_id: expected an "
                                   "integer in [0, vocab_size = 100), found 9e+98"),
          "huge generation_config eos: %s", dfl_errmsg());
    write_text(dir, "generation_config.json", "{\"eos_token_id\": 7,}");
    CHECK(config_load_eos(&c, dir) == DFL_ERR && strstr(dfl_errmsg(), "generation_config.json: not valid JSON"),
          "bad generation_config: %s", dfl_errmsg());
    write_text(dir, "generation_config.json", "{}");
    write_text(dir, "tokenizer_config.json",
               "{\"eos_token\": {\"content\": \"<e>\"}, \"added_tokens_decoder\": "
               "{\"99999999999999999999999\": {\"content\": \"<e>\"}}}");
    CHECK(config_load_eos(&c, dir) == DFL_ERR && strstr(dfl_errmsg(), "tokenizer_config.json") &&
              strstr(dfl_errmsg(), "found '99999999999999999999999'"),
          "huge tokenizer_config key: %s", dfl_errmsg());
    write_text(dir, "tokenizer_config.json",
               "{\"eos_token\": \"<e>\", \"added_tokens_decoder\": {\"-5\": {\"content\": \"<e>\"}}}");
    CHECK(config_load_eos(&c, dir) == DFL_ERR && strstr(dfl_errmsg(), "found '-5'"), "negative key: %s", dfl_errmsg());
}

int main(void) {
    dfl_config c;
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
                    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":100,"
                    "\"rope_theta\":10000,\"tie_word_embeddings\":true,\"eos_token_id\":7}") == DFL_OK,
          "qwen3: %s", dfl_errmsg());
    CHECK(c.arch == DFL_ARCH_QWEN3 && c.rope_theta == 10000 && c.rot_dim == 32 && c.tie_embeddings && c.n_eos == 1 &&
              c.layer_types[1] == DFL_LAYER_FULL,
          "qwen3 fields");
    /* transformers 5 nests rope settings */
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
                    "\"num_attention_heads\":4,\"vocab_size\":100,\"rope_parameters\":{\"rope_type\":\"default\","
                    "\"rope_theta\":5e5}}") == DFL_OK &&
              c.rope_theta == 5e5 && c.head_dim == 16 && c.n_kv_heads == 4 && !c.tie_embeddings,
          "nested rope: %s", dfl_errmsg());
    CHECK(parse(&c,
                "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
                "\"num_attention_heads\":4,\"vocab_size\":100,\"rope_scaling\":{\"rope_type\":\"yarn\"}}") == DFL_ERR &&
              strstr(dfl_errmsg(), "yarn"),
          "yarn refused: %s", dfl_errmsg());
    /* VLM config: text settings under text_config, full_attention_interval, partial rotary */
    const char *vlm = "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":false,\"text_config\":{\"hidden_size\":128,"
                      "\"num_hidden_layers\":8,\"intermediate_size\":256,\"num_attention_heads\":4,"
                      "\"num_key_value_heads\":2,\"head_dim\":64,\"vocab_size\":1024,\"linear_num_key_heads\":2,"
                      "\"linear_num_value_heads\":4,\"linear_key_head_dim\":32,\"linear_value_head_dim\":32,"
                      "\"full_attention_interval\":4,\"rope_parameters\":{\"rope_theta\":1e7,"
                      "\"partial_rotary_factor\":0.25,\"mrope_section\":[11,11,10]}},\"vision_config\":{}}";
    CHECK(parse(&c, vlm) == DFL_OK, "vlm: %s", dfl_errmsg());
    CHECK(c.arch == DFL_ARCH_QWEN3_5 && c.text_config && c.rot_dim == 16 && c.layer_types[0] == DFL_LAYER_LINEAR &&
              c.layer_types[3] == DFL_LAYER_FULL && c.layer_types[7] == DFL_LAYER_FULL && c.lin_v_heads == 4 &&
              c.conv_kernel == 4 && !c.tie_embeddings,
          "vlm fields");
    char pat[16];
    config_layer_pattern(&c, pat, sizeof pat);
    CHECK(strcmp(pat, "LLLFLLLF") == 0, "pattern %s", pat);
    CHECK(parse(&c, "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":64,\"num_hidden_layers\":3,"
                    "\"intermediate_size\":128,\"num_attention_heads\":2,\"vocab_size\":10,"
                    "\"layer_types\":[\"linear_attention\",\"full_attention\"]}") == DFL_ERR &&
              strstr(dfl_errmsg(), "layer_types has 2 entries, expected num_hidden_layers = 3"),
          "layer_types count: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"model_type\":\"qwen3_5\",\"tie_word_embeddings\":true,\"text_config\":{\"hidden_size\":64,"
                    "\"num_hidden_layers\":1,\"intermediate_size\":1,\"num_attention_heads\":1,\"vocab_size\":10,"
                    "\"tie_word_embeddings\":false}}") == DFL_ERR &&
              strstr(dfl_errmsg(), "tie_word_embeddings"),
          "tie disagreement: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"model_type\":\"llama\"}") == DFL_ERR &&
              strstr(dfl_errmsg(), "unsupported model_type 'llama'") && strstr(dfl_errmsg(), "qwen3_5_text"),
          "unknown arch lists supported: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",\"hidden_size\":\"big\"}") == DFL_ERR &&
              strstr(dfl_errmsg(), "hidden_size: expected an integer in [1, 65536], found \"big\""),
          "type error: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",") == DFL_ERR && strstr(dfl_errmsg(), "not valid JSON"), "bad json");
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",\"num_hidden_layers\":2}") == DFL_ERR &&
              strstr(dfl_errmsg(), "missing required field 'hidden_size'"),
          "missing field: %s", dfl_errmsg());

    /* drafters: dflash_config first, then top-level fields; default target ids (docs/design.md §4) */
    const char *d1 = "{\"architectures\":[\"DFlashDraftModel\"],\"model_type\":\"qwen3\",\"hidden_size\":64,"
                     "\"num_hidden_layers\":5,\"intermediate_size\":128,\"num_attention_heads\":4,"
                     "\"num_key_value_heads\":2,\"head_dim\":32,\"block_size\":16,\"num_target_layers\":36,"
                     "\"dflash_config\":{\"mask_token_id\":151669}}";
    CHECK(parse(&c, d1) == DFL_OK, "drafter: %s", dfl_errmsg());
    int want8b[5] = {1, 9, 17, 25, 33};
    CHECK(c.arch == DFL_ARCH_DFLASH && c.mask_token_id == 151669 && c.block_size == 16 && c.n_target_ids == 5 &&
              c.target_ids_default && memcmp(c.target_layer_ids, want8b, sizeof want8b) == 0,
          "Qwen3-8B default ids");
    int ids[8];
    config_default_target_ids(64, 5, ids);
    CHECK(ids[0] == 1 && ids[1] == 16 && ids[2] == 31 && ids[3] == 46 && ids[4] == 61, "27B default ids");
    config_default_target_ids(8, 3, ids);
    CHECK(ids[0] == 1 && ids[1] == 3 && ids[2] == 5, "8/3 default ids %d %d %d", ids[0], ids[1], ids[2]);
    config_default_target_ids(36, 1, ids);
    CHECK(ids[0] == 18, "one layer -> n/2");
    const char *d2 = "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                     "\"intermediate_size\":128,\"num_attention_heads\":4,\"block_size\":8,\"mask_token_id\":5,"
                     "\"target_layer_ids\":[0,2],\"layer_types\":[\"sliding_attention\",\"full_attention\"],"
                     "\"sliding_window\":4,\"dflash_config\":{\"block_size\":10}}";
    CHECK(parse(&c, d2) == DFL_OK && c.block_size == 10 && c.mask_token_id == 5 && c.n_target_ids == 2 &&
              c.target_layer_ids[1] == 2 && !c.target_ids_default && c.layer_types[0] == DFL_LAYER_SLIDING &&
              c.sliding_window == 4,
          "top-level fallback: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                    "\"intermediate_size\":128,\"num_attention_heads\":4}") == DFL_ERR &&
              strstr(dfl_errmsg(), "mask_token_id"),
          "drafter without mask id: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                    "\"intermediate_size\":128,\"num_attention_heads\":4,\"mask_token_id\":1,\"block_size\":1}") ==
                  DFL_ERR &&
              strstr(dfl_errmsg(), "block_size"),
          "block size 1: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                    "\"intermediate_size\":128,\"num_attention_heads\":4,\"mask_token_id\":1,"
                    "\"layer_types\":[\"sliding_attention\"]}") == DFL_ERR &&
              strstr(dfl_errmsg(), "sliding_window"),
          "sliding without window: %s", dfl_errmsg());
    test_ranges();
    test_dflash2();
    test_dflash_causal();
    test_extra_eos();
    test_moe();
    return test_done("test_config");
}
