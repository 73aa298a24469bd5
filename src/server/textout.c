/* Incremental detokenization for dfl serve: each new token's text is appended once the bytes
 * decoded so far end on a whole UTF-8 character, so the running text always equals decoding
 * the full id list at once (byte-level BPE decodes token by token), and stop strings are
 * detected at the token that completes them. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/prompt.h"
#include "server/server_internal.h"

static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */

void textout_init(textout *t, const dfl_tokenizer *tok, char **stops, int n_stops) {
    memset(t, 0, sizeof *t);
    t->tok = tok;
    t->stops = stops;
    t->n_stops = n_stops;
    t->stop_at = -1;
    t->stop_idx = -1;
}

void textout_free(textout *t) {
    free(t->ids);
    free(t->text);
    t->ids = NULL;
    t->text = NULL;
}

static int append_text(textout *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->tcap) {
        size_t cap = t->tcap ? t->tcap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p) return dfl_seterr("out of memory for output text");
        t->text = p;
        t->tcap = cap;
    }
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = 0;
    return DFL_OK;
}

/* Search the stop strings in the text added since old_len (matches may start earlier). */
static int find_stop(textout *t, size_t old_len) {
    long best = -1;
    int idx = -1;
    for (int i = 0; i < t->n_stops; i++) {
        const size_t sl = strlen(t->stops[i]);
        if (sl == 0 || sl > t->len) continue;
        const size_t from = old_len >= sl - 1 ? old_len - (sl - 1) : 0;
        const char *p = memmem(t->text + from, t->len - from, t->stops[i], sl);
        if (p && (best < 0 || p - t->text < best)) best = p - t->text, idx = i;
    }
    if (best < 0) return 0;
    t->stop_at = best;
    t->stop_idx = idx;
    return 1;
}

/* Held-back text (ids[clean..n) decode to a trailing incomplete character) can already complete
 * a stop string: everything before the trailing U+FFFD run is final, since later bytes can only
 * complete that character. On a match the final part is appended and the stop set (no further
 * token is taken); otherwise the text is left as it was. */
static int find_stop_pending(textout *t) {
    char *tail = prompt_decode(t->tok, t->ids + t->clean, (size_t)(t->n - t->clean), NULL);
    if (!tail) return dfl_seterr("out of memory decoding output");
    size_t tl = strlen(tail);
    while (tl >= 3 && memcmp(tail + tl - 3, replacement, 3) == 0) tl -= 3;
    int rc = 0;
    if (tl > 0) {
        const size_t old = t->len;
        if (append_text(t, tail, tl) != DFL_OK) {
            rc = DFL_ERR;
        } else if (!(rc = find_stop(t, old))) {
            t->len = old;
            t->text[old] = 0;
        }
    }
    free(tail);
    return rc;
}

int textout_push(textout *t, int32_t id) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        int32_t *p = realloc(t->ids, (size_t)cap * sizeof *p);
        if (!p) return dfl_seterr("out of memory for output ids");
        t->ids = p;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    if (t->stop_at >= 0) return 1;
    char *tail = prompt_decode(t->tok, t->ids + t->clean, (size_t)(t->n - t->clean), NULL);
    if (!tail) return dfl_seterr("out of memory decoding output");
    const size_t tl = strlen(tail);
    int rc = 0;
    const size_t old = t->len;
    if (tl < 3 || memcmp(tail + tl - 3, replacement, 3) != 0) {
        if (append_text(t, tail, tl) != DFL_OK) rc = DFL_ERR;
        else t->clean = t->n;
    } else if (t->n - t->clean > 3) {
        /* A trailing U+FFFD may be a character that the next tokens complete: wait for them. But
         * an incomplete character spans at most 3 bytes, so at most the last 3 tokens: when the
         * ids before them decode on their own to a prefix of the tail, that prefix is final (the
         * bytes that could complete it are already there), and runs of invalid bytes do not hold
         * the text back for ever. */
        const int b = t->n - 3;
        char *head = prompt_decode(t->tok, t->ids + t->clean, (size_t)(b - t->clean), NULL);
        char *rest = prompt_decode(t->tok, t->ids + b, 3, NULL);
        if (!head || !rest) {
            rc = dfl_seterr("out of memory decoding output");
        } else {
            const size_t hl = strlen(head);
            if (hl + strlen(rest) == tl && memcmp(tail, head, hl) == 0 && strcmp(tail + hl, rest) == 0) {
                if (append_text(t, head, hl) != DFL_OK) rc = DFL_ERR;
                else t->clean = b;
            }
        }
        free(head);
        free(rest);
    }
    if (rc == 0 && t->len > old) rc = find_stop(t, old);
    if (rc == 0 && t->clean < t->n && t->n_stops > 0) rc = find_stop_pending(t);
    free(tail);
    return rc;
}

size_t textout_safe(const textout *t) {
    if (t->stop_at >= 0) return (size_t)t->stop_at;
    size_t hold = 0;
    for (int i = 0; i < t->n_stops; i++) {
        const size_t sl = strlen(t->stops[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= t->len && memcmp(t->text + t->len - k, t->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return t->len - hold;
}

char *textout_final(const textout *t) {
    if (t->stop_at >= 0) return strndup(t->text, (size_t)t->stop_at);
    char *tail = prompt_decode(t->tok, t->ids + t->clean, (size_t)(t->n - t->clean), NULL);
    if (!tail) return NULL;
    const size_t tl = strlen(tail);
    char *s = malloc(t->len + tl + 1);
    if (s) {
        if (t->len) memcpy(s, t->text, t->len);
        memcpy(s + t->len, tail, tl + 1);
    }
    free(tail);
    return s;
}
