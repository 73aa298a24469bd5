/* Decoding and vocabulary queries. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "tokenizer/tok_internal.h"

/* HF's ByteLevel decoder, token by token: a token whose characters all stand for bytes becomes
 * those bytes; any other token (e.g. an added token containing a plain space) is kept as its
 * UTF-8 text. The concatenation may end mid-character or hold invalid sequences; like HF
 * (String::from_utf8_lossy), each maximal invalid subpart becomes U+FFFD. */
static size_t bytelevel_token(const dfl_tokenizer *tok, const char *t, char *out) {
    const unsigned char *u = (const unsigned char *)t;
    size_t len = strlen(t), o = 0;
    for (size_t i = 0; i < len;) {
        int k = tok_utf8_char(u + i, len - i);
        uint32_t cp = k == 1 ? u[i] : k == 2 ? (uint32_t)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F) : 0x110000;
        if (cp >= sizeof tok->cp_byte / sizeof tok->cp_byte[0] || tok->cp_byte[cp] < 0) {
            memcpy(out, t, len);
            return len;
        }
        out[o++] = (char)tok->cp_byte[cp];
        i += (size_t)k;
    }
    return o;
}

char *tok_decode_len(const dfl_tokenizer *tok, const int32_t *ids, size_t n_ids, int skip_special, size_t *len_out) {
    size_t cap = 64, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        dfl_seterr("out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids) {
            free(buf);
            dfl_seterr("id %d (at position %zu) is out of range [0, %d)", id, i, tok->n_ids);
            return NULL;
        }
        int32_t a = tok->id_added[id];
        if (a >= 0 && skip_special && tok->added[a].special) continue;
        const char *t = a >= 0 ? tok->added[a].content : tok->id_tok[id];
        if (!t) {
            free(buf);
            dfl_seterr("id %d (at position %zu) is not assigned to any token", id, i);
            return NULL;
        }
        size_t need = strlen(t); /* a decoded token is never longer than its text */
        if (n + need > cap) {
            while (n + need > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                dfl_seterr("out of memory");
                return NULL;
            }
            buf = nb;
        }
        n += bytelevel_token(tok, t, buf + n);
    }
    size_t len;
    char *out = tok_utf8_lossy(buf, n, &len);
    free(buf);
    if (out && len_out) *len_out = len;
    return out;
}

char *tok_decode(const dfl_tokenizer *tok, const int32_t *ids, size_t n_ids, int skip_special) {
    return tok_decode_len(tok, ids, n_ids, skip_special, NULL);
}

int32_t tok_token_id(const dfl_tokenizer *tok, const char *token) {
    size_t len = strlen(token);
    int32_t id = tok_strmap_get(&tok->added_ids, token, len);
    return id >= 0 ? id : tok_strmap_get(&tok->vocab, token, len);
}

int32_t tok_vocab_size(const dfl_tokenizer *tok) { return tok->n_ids; }

int tok_has_id(const dfl_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->id_added[id] >= 0 || tok->id_tok[id] != NULL);
}

int tok_is_added(const dfl_tokenizer *tok, int32_t id) { return id >= 0 && id < tok->n_ids && tok->id_added[id] >= 0; }

int tok_is_special(const dfl_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && tok->id_added[id] >= 0 && tok->added[tok->id_added[id]].special;
}
