/* Reference outputs for agreement checks: a JSON-lines file or an HTTP server. */
#ifndef DFL_REFERENCE_H
#define DFL_REFERENCE_H

#include <stdint.h>

#include "dfl/tokenizer.h"

typedef struct ref_entry {
    char id[128];
    int turn;
    int32_t *ids;
    int n;
} ref_entry;

typedef struct ref_set {
    ref_entry *e;
    int n;
} ref_set;

/* First index where a and b differ; the shorter length if one is a prefix of the other;
 * -1 if identical. */
int ref_first_divergence(const int32_t *a, int na, const int32_t *b, int nb);

/* JSON lines {"id": ..., ["turn": 0|1,] "output_ids"|"token_ids"|"tokens": [...] | "text": "..."}
 * (text is encoded with tok). Errors name file and line. */
int ref_file_load(ref_set *rs, const char *path, const dfl_tokenizer *tok);
const ref_entry *ref_find(const ref_set *rs, const char *id, int turn);
void ref_set_free(ref_set *rs);

/* Greedy completion of prompt ids from a server: URL ending in /generate (SGLang: input_ids ->
 * output_ids) or an OpenAI-compatible /v1/completions (prompt ids, temperature 0 ->
 * choices[0].token_ids). *ids malloc'd. */
int ref_url_generate(const char *url, const int32_t *prompt, int n_prompt, int max_new, int32_t **ids, int *n);

#endif
