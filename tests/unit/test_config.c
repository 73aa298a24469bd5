/* config.json parsing: architectures, nested/top-level rope, layer types, drafter fields. */
#include <string.h>

#include "dfl/common.h"
#include "dfl/config.h"
#include "testutil.h"

static int parse(dfl_config *c, const char *json) { return config_parse(c, json, "config.json"); }

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
                    "\"rope_theta\":5e5}}") == DFL_OK && c.rope_theta == 5e5 && c.head_dim == 16 &&
              c.n_kv_heads == 4 && !c.tie_embeddings,
          "nested rope: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_hidden_layers\":2,\"intermediate_size\":128,"
                    "\"num_attention_heads\":4,\"vocab_size\":100,\"rope_scaling\":{\"rope_type\":\"yarn\"}}") ==
                  DFL_ERR && strstr(dfl_errmsg(), "yarn"),
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
    CHECK(parse(&c, "{\"model_type\":\"llama\"}") == DFL_ERR && strstr(dfl_errmsg(), "unsupported model_type 'llama'") &&
              strstr(dfl_errmsg(), "qwen3_5_text"),
          "unknown arch lists supported: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",\"hidden_size\":\"big\"}") == DFL_ERR &&
              strstr(dfl_errmsg(), "'hidden_size' must be an integer"),
          "type error: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",") == DFL_ERR && strstr(dfl_errmsg(), "not valid JSON"), "bad json");
    CHECK(parse(&c, "{\"model_type\":\"qwen3\",\"num_hidden_layers\":2}") == DFL_ERR &&
              strstr(dfl_errmsg(), "missing required field 'hidden_size'"),
          "missing field: %s", dfl_errmsg());

    /* drafters: dflash_config first, then top-level fields; default target ids (SPEC §4) */
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
                  DFL_ERR && strstr(dfl_errmsg(), "block_size"),
          "block size 1: %s", dfl_errmsg());
    CHECK(parse(&c, "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                    "\"intermediate_size\":128,\"num_attention_heads\":4,\"mask_token_id\":1,"
                    "\"layer_types\":[\"sliding_attention\"]}") == DFL_ERR &&
              strstr(dfl_errmsg(), "sliding_window"),
          "sliding without window: %s", dfl_errmsg());
    return test_done("test_config");
}
