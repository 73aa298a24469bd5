/* Fuzz config.json parsing (config_parse, and quant_parse's quantization_config): any text either
 * parses or is refused with a message naming the file; a parsed config keeps the bounds the
 * loaders rely on, and parsing is deterministic (a second parse gives the same struct, byte for
 * byte). */
#include <string.h>

#include "dfl/common.h"
#include "dfl/config.h"
#include "dfl/quant.h"
#include "fuzz_util.h"

static void check_config(const dfl_config *c) {
    FUZZ_CHECK(c->arch == DFL_ARCH_QWEN3 || c->arch == DFL_ARCH_QWEN3_5 || c->arch == DFL_ARCH_DFLASH, "arch %d",
               (int)c->arch);
    FUZZ_CHECK(memchr(c->model_type, 0, sizeof c->model_type) && memchr(c->architecture, 0, sizeof c->architecture),
               "unterminated strings");
    FUZZ_CHECK(c->n_layers >= 1 && c->n_layers <= DFL_MAX_LAYERS, "n_layers %d", c->n_layers);
    FUZZ_CHECK(c->hidden > 0 && c->n_heads > 0 && c->n_kv_heads > 0 && c->head_dim > 0 && c->intermediate > 0,
               "sizes %d %d %d %d %d", c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->intermediate);
    FUZZ_CHECK(c->rot_dim >= 0 && c->rot_dim <= c->head_dim && c->rot_dim % 2 == 0, "rot_dim %d of %d", c->rot_dim,
               c->head_dim);
    FUZZ_CHECK(c->rope_theta > 0 && c->partial_rotary > 0 && c->partial_rotary <= 1, "rope");
    FUZZ_CHECK(c->n_eos >= 0 && c->n_eos <= DFL_MAX_EOS, "n_eos %d", c->n_eos);
    for (int i = 0; i < c->n_eos; i++)
        FUZZ_CHECK(c->eos_ids[i] >= 0 && (c->vocab == 0 || c->eos_ids[i] < c->vocab), "eos id %d", c->eos_ids[i]);
    for (int i = 0; i < c->n_layers; i++)
        FUZZ_CHECK(c->layer_types[i] == DFL_LAYER_FULL || c->layer_types[i] == DFL_LAYER_LINEAR ||
                       c->layer_types[i] == DFL_LAYER_SLIDING,
                   "layer type %d", (int)c->layer_types[i]);
    if (c->arch == DFL_ARCH_DFLASH) {
        FUZZ_CHECK(c->block_size >= 2 && c->block_size <= 256, "block_size %d", c->block_size);
        FUZZ_CHECK(c->mask_token_id >= 0, "mask_token_id %d", c->mask_token_id);
        FUZZ_CHECK(c->n_target_ids >= 0 && c->n_target_ids <= DFL_MAX_LAYERS, "n_target_ids %d", c->n_target_ids);
        if (c->target_ids_default) { /* the formula's ids (checked against the target by drafter_open) */
            int ids[DFL_MAX_LAYERS];
            FUZZ_CHECK(c->n_target_ids == c->n_layers && c->n_target_layers > 0, "default ids");
            config_default_target_ids(c->n_target_layers, c->n_layers, ids);
            FUZZ_CHECK(memcmp(ids, c->target_layer_ids, (size_t)c->n_layers * sizeof *ids) == 0, "default ids");
        } else {
            for (int i = 0; i < c->n_target_ids; i++)
                FUZZ_CHECK(c->target_layer_ids[i] >= 0 && c->target_layer_ids[i] < DFL_MAX_LAYERS, "target id %d",
                           c->target_layer_ids[i]);
        }
    } else {
        FUZZ_CHECK(c->vocab > 0, "vocab %d", c->vocab);
    }
    if (c->arch == DFL_ARCH_QWEN3_5)
        FUZZ_CHECK(c->lin_k_heads > 0 && c->lin_v_heads % c->lin_k_heads == 0 && c->conv_kernel > 0, "linear attn");
    char pat[DFL_MAX_LAYERS + 1];
    config_layer_pattern(c, pat, sizeof pat);
    FUZZ_CHECK((int)strlen(pat) == c->n_layers, "pattern length");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = fuzz_cstr(data, size);
    static dfl_config a, b;
    dfl_clearerr();
    int rc = config_parse(&a, json, "fuzz/config.json");
    if (rc != DFL_OK) {
        FUZZ_CHECK(rc == DFL_ERR && strstr(dfl_errmsg(), "fuzz/config.json"), "error message: %s", dfl_errmsg());
    } else {
        check_config(&a);
        FUZZ_CHECK(config_parse(&b, json, "fuzz/config.json") == DFL_OK && memcmp(&a, &b, sizeof a) == 0,
                   "a second parse differs");
    }
    dfl_quant q;
    dfl_clearerr();
    rc = quant_parse(&q, json, "fuzz/config.json");
    if (rc != DFL_OK) {
        FUZZ_CHECK(rc == DFL_ERR && strstr(dfl_errmsg(), "fuzz/config.json") && q.n_not_convert == 0,
                   "quantization_config error: %s", dfl_errmsg());
    } else if (q.present) { /* what the loader relies on: fp8, a block size, module names */
        FUZZ_CHECK(strcmp(q.method, "fp8") == 0 && strcmp(q.fmt, "e4m3") == 0, "method %s fmt %s", q.method, q.fmt);
        FUZZ_CHECK(q.block_rows >= 1 && q.block_cols >= 1 && q.block_rows <= 65536 && q.block_cols <= 65536,
                   "block %d x %d", q.block_rows, q.block_cols);
        for (int i = 0; i < q.n_not_convert; i++) FUZZ_CHECK(q.not_convert[i] && q.not_convert[i][0], "module %d", i);
    }
    quant_free(&q);
    free(json);
    return 0;
}
