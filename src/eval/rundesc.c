/* What an eval run ran (DIR/run.json, include/dfl/eval.h): prompt hashes, the options runs must
 * share to be merged or resumed, and prompt sets for eval-compare. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void eval_prompt_hash(const eval_prompt *p, int first_turn, char out[24]) {
    uint64_t h = 0xcbf29ce484222325ull;
    const int turns = first_turn ? 1 : p->n_turns;
    for (int k = 0; k < turns; k++) { /* each turn with its length: "ab" + "c" is not "a" + "bc" */
        char len[32];
        const size_t n = strlen(p->turns[k]);
        snprintf(len, sizeof len, "%zu:", n);
        h = fnv1a(h, len, strlen(len));
        h = fnv1a(h, p->turns[k], n);
    }
    snprintf(out, 24, "%016llx", (unsigned long long)h);
}

/* The options two runs must share: one summary over both would mix what they measure. */
static const char *const FIELDS[] = {
    "method", "target_config_hash", "target_weights_hash", "activations", "max_new",
    "chat",   "first_turn",         "temperature",         "seed",        "accept_rule",
    NULL};

const char *eval_run_differs(const cJSON *a, const cJSON *b, char *msg, size_t n) {
    for (int i = 0; FIELDS[i]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(a, FIELDS[i]),
                    *y = cJSON_GetObjectItemCaseSensitive(b, FIELDS[i]);
        if (!x || !y || cJSON_Compare(x, y, 1)) continue;
        char bx[96], by[96];
        snprintf(msg, n, "%s %s vs %s", FIELDS[i], dfl_json_brief(x, bx, sizeof bx), dfl_json_brief(y, by, sizeof by));
        return FIELDS[i];
    }
    return NULL;
}

static int cmp_key(const void *x, const void *y) {
    return strcmp((*(const cJSON *const *)x)->string, (*(const cJSON *const *)y)->string);
}

int eval_prompt_set(const cJSON *prompts, char hash[24], char ids[24]) {
    const int n = cJSON_GetArraySize(prompts);
    const cJSON **v = calloc((size_t)n + 1, sizeof *v);
    hash[0] = ids[0] = 0;
    if (!v) return -1;
    int k = 0, known = 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, prompts) if (e->string && k < n) v[k++] = e;
    qsort(v, (size_t)k, sizeof *v, cmp_key);
    uint64_t h = 0xcbf29ce484222325ull, hi = h;
    for (int i = 0; i < k; i++) {
        const size_t len = strlen(v[i]->string) + 1; /* with its NUL: a separator no id holds */
        h = fnv1a(h, v[i]->string, len), hi = fnv1a(hi, v[i]->string, len);
        if (cJSON_IsString(v[i]) && v[i]->valuestring[0])
            h = fnv1a(h, v[i]->valuestring, strlen(v[i]->valuestring) + 1);
        else known = 0;
    }
    free(v);
    if (known) snprintf(hash, 24, "%016llx", (unsigned long long)h);
    snprintf(ids, 24, "%016llx", (unsigned long long)hi);
    return k;
}
