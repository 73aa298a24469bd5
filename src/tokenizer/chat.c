/* Chat templates (Qwen3 ChatML, with or without thinking), prompt ids from text, decoding for
 * display: how generate, eval and serve turn text into ids and back (include/dfl/prompt.h). */
#include "dfl/prompt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"

int prompt_chat_parse(const char *s) {
    if (strcmp(s, "none") == 0) return DFL_CHAT_NONE;
    if (strcmp(s, "chatml") == 0) return DFL_CHAT_CHATML;
    if (strcmp(s, "chatml-nothink") == 0) return DFL_CHAT_CHATML_NOTHINK;
    return -1;
}

char *prompt_format(const char *user, dfl_chat mode) {
    static const char *pre = "<|im_start|>user\n", *post = "<|im_end|>\n<|im_start|>assistant\n";
    static const char *nothink = "<think>\n\n</think>\n\n";
    if (mode == DFL_CHAT_NONE) return strdup(user);
    size_t n = strlen(pre) + strlen(user) + strlen(post) + strlen(nothink) + 1;
    char *s = malloc(n);
    if (!s) return NULL;
    snprintf(s, n, "%s%s%s%s", pre, user, post, mode == DFL_CHAT_CHATML_NOTHINK ? nothink : "");
    return s;
}

int prompt_parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return dfl_seterr("out of memory");
    const char *p = s;
    while (*p) {
        if (strchr(" \t\r\n,[]", *p)) {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p) {
            free(v);
            return dfl_seterr("token ids: expected a non-negative integer at '%.20s'", p);
        }
        if (errno == ERANGE || x < 0 || x > INT32_MAX) {
            free(v);
            return dfl_seterr("token id %.*s is out of range [0, %d]", (int)(end - p < 40 ? end - p : 40), p,
                              INT32_MAX);
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return dfl_seterr("out of memory");
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    *n = k;
    return DFL_OK;
}

char *prompt_decode(const dfl_tokenizer *tok, const int32_t *ids, size_t n, int *n_unknown) {
    int32_t *known = malloc((n + 1) * sizeof *known);
    if (!known) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (tok_has_id(tok, ids[i])) known[k++] = ids[i];
    if (n_unknown) *n_unknown = (int)(n - k);
    char *s = tok_decode(tok, known, k, 1);
    free(known);
    return s;
}
