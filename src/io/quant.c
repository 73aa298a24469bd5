/* quantization_config parsing (fine-grained FP8, see dfl/quant.h). */
#include "dfl/quant.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"

#define MAX_BLOCK 65536

/* An optional string field: its value in out (default kept when absent), then checked to be one
 * of the accepted values. */
static int get_choice(const cJSON *qc, const char *field, const char *where, const char *accepted, const char *why,
                      char *out, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(qc, field);
    char b[96];
    if (!v || cJSON_IsNull(v)) return DFL_OK;
    if (!cJSON_IsString(v) || strcmp(v->valuestring, accepted) != 0)
        return dfl_seterr("%s: quantization_config.%s: expected \"%s\", found %s%s", where, field, accepted,
                          dfl_json_brief(v, b, sizeof b), why);
    snprintf(out, n, "%s", v->valuestring);
    return DFL_OK;
}

static int parse_block(dfl_quant *q, const cJSON *qc, const char *where) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(qc, "weight_block_size");
    char s[96];
    if (!b || cJSON_IsNull(b))
        return dfl_seterr("%s: quantization_config.weight_block_size: missing; dfl reads fine-grained FP8 (one "
                          "weight_scale_inv per block, e.g. weight_block_size [128, 128]), not per-tensor scales",
                          where);
    int v[2];
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2 ? cJSON_GetArrayItem(b, i) : NULL;
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= 1 && x->valuedouble <= MAX_BLOCK) ||
            x->valuedouble != floor(x->valuedouble))
            return dfl_seterr("%s: quantization_config.weight_block_size: expected two integers in [1, %d] "
                              "([rows, columns] of a block), found %s",
                              where, MAX_BLOCK, dfl_json_brief(b, s, sizeof s));
        v[i] = (int)x->valuedouble;
    }
    q->block_rows = v[0], q->block_cols = v[1];
    return DFL_OK;
}

static int parse_not_convert(dfl_quant *q, const cJSON *qc, const char *where) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(qc, "modules_to_not_convert");
    if (!l || cJSON_IsNull(l)) return DFL_OK;
    if (!cJSON_IsArray(l))
        return dfl_seterr("%s: quantization_config.modules_to_not_convert: expected an array of module names", where);
    const int n = cJSON_GetArraySize(l);
    q->not_convert = calloc((size_t)n + 1, sizeof *q->not_convert);
    if (!q->not_convert) return dfl_seterr("%s: out of memory", where);
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetArrayItem(l, i);
        if (!cJSON_IsString(s) || !s->valuestring[0])
            return dfl_seterr("%s: quantization_config.modules_to_not_convert[%d]: expected a module name", where, i);
        if (!(q->not_convert[i] = strdup(s->valuestring))) return dfl_seterr("%s: out of memory", where);
        q->n_not_convert = i + 1;
    }
    return DFL_OK;
}

int quant_parse(dfl_quant *q, const char *json, const char *where) {
    memset(q, 0, sizeof *q);
    cJSON *root = cJSON_ParseWithOpts(json, NULL, 1);
    if (!root) return dfl_seterr("%s: not valid JSON", where);
    int rc = DFL_ERR;
    const cJSON *qc = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "quantization_config") : NULL;
    const cJSON *m = NULL;
    char b[96];
    if (!qc || cJSON_IsNull(qc)) {
        rc = DFL_OK;
        goto done;
    }
    if (!cJSON_IsObject(qc)) {
        dfl_seterr("%s: quantization_config: expected an object, found %s", where, dfl_json_brief(qc, b, sizeof b));
        goto done;
    }
    q->present = 1;
    m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    if (!cJSON_IsString(m) || strcmp(m->valuestring, "fp8") != 0) {
        dfl_seterr("%s: quantization_config.quant_method: expected \"fp8\" (fine-grained float8_e4m3 weights with "
                   "per-block weight_scale_inv), found %s; dfl does not read this quantization: use the BF16 or "
                   "FP8 release",
                   where, dfl_json_brief(m, b, sizeof b));
        goto done;
    }
    snprintf(q->method, sizeof q->method, "%s", m->valuestring);
    snprintf(q->fmt, sizeof q->fmt, "e4m3");
    snprintf(q->activation, sizeof q->activation, "dynamic");
    if (get_choice(qc, "fmt", where, "e4m3", " (float8_e4m3fn weights)", q->fmt, sizeof q->fmt) ||
        get_choice(qc, "activation_scheme", where, "dynamic",
                   " (static activation scales are not read: dfl keeps activations in float32)", q->activation,
                   sizeof q->activation) ||
        parse_block(q, qc, where) || parse_not_convert(q, qc, where))
        goto done;
    rc = DFL_OK;
done:
    cJSON_Delete(root);
    if (rc != DFL_OK) quant_free(q);
    return rc;
}

int quant_load(dfl_quant *q, const char *dir) {
    memset(q, 0, sizeof *q);
    char *path = dfl_path_join(dir, "config.json");
    char *text = path ? dfl_read_file(path, NULL) : NULL;
    int rc = text ? quant_parse(q, text, path) : DFL_ERR;
    free(text);
    free(path);
    return rc;
}

void quant_free(dfl_quant *q) {
    for (int i = 0; i < q->n_not_convert; i++) free(q->not_convert[i]);
    free(q->not_convert);
    memset(q, 0, sizeof *q);
}

int quant_module_excluded(const dfl_quant *q, const char *module) {
    const size_t n = strlen(module);
    for (int i = 0; i < q->n_not_convert; i++) {
        const char *p = q->not_convert[i];
        const size_t k = strlen(p);
        if (k > n) continue;
        if (strncmp(module, p, k) == 0 && (module[k] == 0 || module[k] == '.')) return 1;
        if (strcmp(module + n - k, p) == 0 && (k == n || module[n - k - 1] == '.')) return 1;
    }
    return 0;
}
