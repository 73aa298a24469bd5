/* quantization_config parsing (dfl/quant.h): the released FP8 layout, the defaults, every refusal
 * naming the field with expected vs found, and which modules modules_to_not_convert excludes. */
#include <string.h>

#include "dfl/common.h"
#include "dfl/quant.h"
#include "testutil.h"

static const char *const RELEASED =
    "{\"model_type\": \"qwen3\", \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
    "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 64], \"modules_to_not_convert\": [\"lm_head\", "
    "\"model.visual\", \"in_proj_a\", \"model.layers.1.mlp.gate\"]}}";

/* A config with this quantization_config must be refused with every needle in the message. */
static void refused(const char *qc, const char *n1, const char *n2) {
    char json[512];
    snprintf(json, sizeof json, "{\"model_type\": \"qwen3\", \"quantization_config\": %s}", qc);
    dfl_quant q;
    const int rc = quant_parse(&q, json, "D/config.json");
    const char *m = dfl_errmsg();
    CHECK(rc == DFL_ERR && strstr(m, "D/config.json") && strstr(m, n1) && (!n2 || strstr(m, n2)),
          "%s: rc %d, message '%s'", qc, rc, m);
    CHECK(q.n_not_convert == 0 && !q.not_convert, "%s: nothing held after a refusal", qc);
}

int main(void) {
    dfl_quant q;
    CHECK(quant_parse(&q, RELEASED, "x") == DFL_OK, "released layout: %s", dfl_errmsg());
    CHECK(q.present && !strcmp(q.method, "fp8") && !strcmp(q.fmt, "e4m3") && !strcmp(q.activation, "dynamic") &&
              q.block_rows == 128 && q.block_cols == 64 && q.n_not_convert == 4,
          "released layout fields");
    static const struct {
        const char *module;
        int excluded;
    } mods[] = {{"lm_head", 1},
                {"lm_head2", 0},
                {"model.visual.blocks.0.attn.qkv", 1},
                {"model.visualx.a", 0},
                {"model.layers.0.linear_attn.in_proj_a", 1},
                {"model.layers.0.linear_attn.xin_proj_a", 0},
                {"model.layers.1.mlp.gate", 1},
                {"model.layers.1.mlp.gate_proj", 0},
                {"model.layers.10.mlp.gate", 0},
                {"model.layers.0.self_attn.q_proj", 0}};
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++)
        CHECK(quant_module_excluded(&q, mods[i].module) == mods[i].excluded, "%s excluded: expected %d", mods[i].module,
              mods[i].excluded);
    quant_free(&q);
    CHECK(quant_parse(&q, "{\"model_type\": \"qwen3\"}", "x") == DFL_OK && !q.present, "no quantization_config");
    CHECK(quant_parse(&q, "{\"quantization_config\": null}", "x") == DFL_OK && !q.present, "null");
    CHECK(quant_parse(&q, "{\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [1, 1]}}",
                      "x") == DFL_OK &&
              !strcmp(q.fmt, "e4m3") && !strcmp(q.activation, "dynamic") && q.n_not_convert == 0 && q.block_rows == 1,
          "defaults: %s", dfl_errmsg());
    quant_free(&q);
    refused("{\"quant_method\": \"gptq\", \"bits\": 4}", "quant_method: expected \"fp8\"", "found \"gptq\"");
    refused("{\"quant_method\": \"awq\"}", "quant_method", "found \"awq\"");
    refused("{\"weight_block_size\": [128, 128]}", "quant_method", "found nothing");
    refused("{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\", \"weight_block_size\": [128, 128]}",
            "quantization_config.fmt: expected \"e4m3\"", "found \"e5m2\"");
    refused("{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\", \"weight_block_size\": [128, 128]}",
            "activation_scheme: expected \"dynamic\"", "found \"static\"");
    refused("{\"quant_method\": \"fp8\"}", "weight_block_size: missing", "per-tensor");
    refused("{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}", "weight_block_size: expected two integers",
            "found [128]");
    refused("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 1.5]}", "expected two integers", "[128,1.5]");
    refused("{\"quant_method\": \"fp8\", \"weight_block_size\": [0, 128]}", "in [1, 65536]", "[0,128]");
    refused("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": \"lm_head\"}",
            "modules_to_not_convert: expected an array", NULL);
    refused("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": [\"a\", 3]}",
            "modules_to_not_convert[1]: expected a module name", NULL);
    refused("\"fp8\"", "quantization_config: expected an object", "found \"fp8\"");
    return test_done("test_quant");
}
