/* quantization_config of config.json: fine-grained FP8, the layout of the released Qwen3 /
 * Qwen3.5 "-FP8" checkpoints ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
 * "dynamic", "weight_block_size": [128, 128], "modules_to_not_convert": [...]}). A quantized
 * linear weight `<module>.weight` is F8_E4M3 [rows, cols] with `<module>.weight_scale_inv`
 * [ceil(rows / 128), ceil(cols / 128)] (F32 or BF16) beside it: w = fp8 * scale_inv per block.
 * Modules left unquantized keep their F32/F16/BF16 weights. Activations stay float32 in dfl
 * (weights are dequantized in the kernels), as transformers computes with dequantize=True. */
#ifndef DFL_QUANT_H
#define DFL_QUANT_H

typedef struct dfl_quant {
    int present;                /* config.json has a quantization_config */
    char method[32];            /* quant_method: "fp8" */
    char fmt[16];               /* "e4m3" (the default when absent) */
    char activation[16];        /* activation_scheme: "dynamic" (the default when absent) */
    int block_rows, block_cols; /* weight_block_size */
    char **not_convert;         /* modules_to_not_convert (module names or name prefixes) */
    int n_not_convert;
} dfl_quant;

/* Parse the quantization_config of a config.json text (absent or null: present = 0). Refused,
 * naming the field with expected vs found: another quant_method (gptq, awq, ...), fmt other
 * than e4m3, a static activation scheme, a missing or malformed weight_block_size. */
int quant_parse(dfl_quant *q, const char *json, const char *where);
/* The same for DIR/config.json. */
int quant_load(dfl_quant *q, const char *dir);
void quant_free(dfl_quant *q);
/* 1 if the module (a tensor name without ".weight") is left unquantized by
 * modules_to_not_convert: an entry equal to it, or a prefix or suffix of it that ends or starts
 * at a '.' ("lm_head", "model.visual", "in_proj_a"). transformers matches entries as regular
 * expressions from the name's start, or as plain suffixes; dfl uses the list only to refuse an
 * F8_E4M3 weight of a module it excludes, so it takes the narrower literal reading. */
int quant_module_excluded(const dfl_quant *q, const char *module);

#endif
