/* dfl hidden: dump decoder-layer outputs (and optionally logits) to safetensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/model.h"
#include "dfl/prompt.h"
#include "dfl/safetensors.h"

static const char *usage_text =
    "usage: dfl hidden --target DIR --layers K[,K...] (--prompt STR | --prompt-file F | --prompt-ids IDS)\n"
    "                  --out F.safetensors [--logits] [--chat MODE] [--device cpu|cuda]\n"
    "                  [--weights auto|copy|map]\n"
    "\n"
    "Run the prompt through the target in one forward and write `input_ids` (I64 [T]) and one F32\n"
    "tensor `layer.{k}` of shape [T, H] per requested layer, where layer k is the output of decoder\n"
    "layer k (the residual stream after its MLP) = transformers' hidden_states[k+1]. Layer ids may\n"
    "be 'all'. Compare two dumps with `dfl hidden-diff`.\n"
    "\n"
    "  --target DIR        target checkpoint\n"
    "  --layers LIST       comma-separated decoder layer ids, or 'all'\n" CLI_PROMPT_HELP
    "  --out FILE          output safetensors file\n"
    "  --logits            also write `logits` (F32 [T, V])\n" CLI_DEVICE_HELP;

/* Fill layers from --layers (checked against the model's decoder layers). Returns the exit code. */
static int parse_layers(const dfl_config *c, const char *target, const char *layers_arg, int *layers, int *n_layers) {
    *n_layers = 0;
    if (strcmp(layers_arg, "all") == 0) {
        for (int i = 0; i < c->n_layers; i++) layers[(*n_layers)++] = i;
        return 0;
    }
    long ids[DFL_MAX_LAYERS];
    int n = 0;
    if (cli_parse_long_list("hidden", "--layers", layers_arg, 0, DFL_MAX_LAYERS - 1, ids, DFL_MAX_LAYERS, &n)) return 2;
    for (int i = 0; i < n; i++) {
        if (ids[i] >= c->n_layers)
            return cli_fail("hidden", "--layers: layer %ld does not exist; %s has decoder layers 0..%d", ids[i], target,
                            c->n_layers - 1);
        layers[(*n_layers)++] = (int)ids[i];
    }
    return 0;
}

/* Write input_ids, one [T, H] tensor per layer from the capture cap_out ([T][n_layers][H]) and
 * the logits when given. Returns the exit code. */
static int write_dump(const char *out_path, const int32_t *prompt, size_t T, size_t H, const int *layers, int n_layers,
                      const float *cap_out, const float *logits, int vocab) {
    int rc = 0;
    /* capture is [T][n_layers][H]; the file wants one [T, H] tensor per layer */
    float *per_layer = malloc(T * n_layers * H * sizeof(float));
    int64_t *ids64 = malloc(T * sizeof(int64_t));
    for (size_t t = 0; t < T; t++) ids64[t] = prompt[t];
    for (int k = 0; k < n_layers; k++)
        for (size_t t = 0; t < T; t++)
            memcpy(per_layer + ((size_t)k * T + t) * H, cap_out + (t * n_layers + k) * H, H * sizeof(float));
    st_write_entry *e = calloc((size_t)n_layers + 2, sizeof *e);
    char(*names)[32] = calloc((size_t)n_layers, sizeof *names);
    int ne = 0;
    e[ne++] = (st_write_entry){.name = "input_ids", .dtype = ST_I64, .ndim = 1, .shape = {(int64_t)T}, .data = ids64};
    for (int k = 0; k < n_layers; k++) {
        snprintf(names[k], sizeof names[k], "layer.%d", layers[k]);
        e[ne++] = (st_write_entry){.name = names[k],
                                   .dtype = ST_F32,
                                   .ndim = 2,
                                   .shape = {(int64_t)T, (int64_t)H},
                                   .data = per_layer + (size_t)k * T * H};
    }
    if (logits)
        e[ne++] = (st_write_entry){
            .name = "logits", .dtype = ST_F32, .ndim = 2, .shape = {(int64_t)T, (int64_t)vocab}, .data = logits};
    if (st_write(out_path, e, ne) != DFL_OK) rc = cli_fail("hidden", "%s", dfl_errmsg());
    else
        fprintf(stderr, "[dfl] wrote %s: %zu tokens, %d layers, H %zu%s\n", out_path, T, n_layers, H,
                logits ? ", logits" : "");
    free(per_layer), free(ids64), free(e), free(names);
    return rc;
}

/* One forward over the T prompt tokens, capturing the layers; writes the dump. Returns the exit code. */
static int forward_and_write(dfl_model *m, const int32_t *prompt, size_t T, const int *layers, int n_layers,
                             int want_logits, const char *out_path) {
    const dfl_config *c = &m->cfg;
    dfl_target_state s;
    if (target_state_init(&s, m, (int)T, (int)T, 0) != DFL_OK) return cli_fail("hidden", "%s", dfl_errmsg());
    const size_t H = (size_t)c->hidden;
    float *cap_out = malloc(T * n_layers * H * sizeof(float));
    float *logits = want_logits ? dfl_alloc(T * (size_t)c->vocab * sizeof(float)) : NULL;
    dfl_capture cap = {.n_layers = n_layers, .layers = layers, .out = cap_out};
    int rc;
    if (model_forward(&s, prompt, (int)T, logits, 0, &cap) != DFL_OK) rc = cli_fail("hidden", "%s", dfl_errmsg());
    else rc = write_dump(out_path, prompt, T, H, layers, n_layers, cap_out, logits, c->vocab);
    free(cap_out);
    free(logits);
    target_state_free(&s);
    return rc;
}

int cmd_hidden(int argc, char **argv) {
    const char *target = NULL, *layers_arg = NULL, *out_path = NULL;
    cli_prompt pr = {0};
    int want_logits = 0;
    dfl_device device = DFL_DEVICE_CPU;
    for (int i = 1; i < argc; i++) {
        int r = cli_prompt_option("hidden", &pr, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if ((r = cli_device_option("hidden", argc, argv, &i, &device)) != 0) {
            if (r < 0) return 2;
            continue;
        }
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--target") == 0) target = cli_value(argc, argv, &i);
        else if (strcmp(argv[i], "--layers") == 0) layers_arg = cli_value(argc, argv, &i);
        else if (strcmp(argv[i], "--out") == 0) out_path = cli_value(argc, argv, &i);
        else if (strcmp(argv[i], "--logits") == 0) want_logits = 1;
        else return cli_usage_error("hidden", "unknown argument '%s' (see dfl hidden --help)", argv[i]);
    }
    if (!target || !layers_arg || !out_path) return cli_usage_error("hidden", "needs --target, --layers and --out");
    dfl_model m;
    if (model_open(&m, target, CLI_OPEN_FLAGS(device)) != DFL_OK) return cli_fail("hidden", "%s", dfl_errmsg());
    if (cli_use_device("hidden", &m, device)) {
        model_close(&m);
        return 1;
    }
    int *layers = malloc(sizeof(int) * DFL_MAX_LAYERS);
    int n_layers = 0;
    int rc = parse_layers(&m.cfg, target, layers_arg, layers, &n_layers);
    if (rc == 0) {
        dfl_tokenizer *tok = NULL;
        int32_t *prompt = NULL;
        size_t T = 0;
        rc = cli_prompt_tokens("hidden", &pr, target, 0, &tok, &prompt, &T);
        if (rc == 0) rc = forward_and_write(&m, prompt, T, layers, n_layers, want_logits, out_path);
        free(prompt);
        if (tok) tok_close(tok);
    }
    free(layers);
    model_close(&m);
    return rc;
}
