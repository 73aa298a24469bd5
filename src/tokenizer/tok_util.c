/* Tokenizer helpers: hash maps, UTF-8 validation/repair, added-token matching. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "tokenizer/tok_internal.h"

/* FNV-1a, then a final mix so the low bits (used as the slot index) depend on every byte. */
uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    return h ^ (h >> 32);
}

static size_t pow2_for(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2; /* load factor <= 1/2 */
    return cap;
}

int tok_strmap_init(struct tok_strmap *m, size_t expected) {
    m->cap = pow2_for(expected);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? DFL_OK : dfl_seterr("out of memory (string map of %zu)", expected);
}

void tok_strmap_free(struct tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static struct tok_strent *strmap_slot(const struct tok_strmap *m, const char *key, size_t len) {
    size_t mask = m->cap - 1;
    for (size_t i = tok_hash(key, len) & mask;; i = (i + 1) & mask) {
        struct tok_strent *e = &m->slots[i];
        if (!e->key || (e->len == len && memcmp(e->key, key, len) == 0)) return e;
    }
}

void tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t val) {
    struct tok_strent *e = strmap_slot(m, key, len);
    if (!e->key) {
        e->key = key;
        e->len = (uint32_t)len;
        m->n++;
    }
    e->val = val;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len) {
    const struct tok_strent *e = strmap_slot(m, key, len);
    return e->key ? e->val : -1;
}

int tok_pairmap_init(struct tok_pairmap *m, size_t expected) {
    m->cap = pow2_for(expected);
    m->n = 0;
    m->slots = malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return dfl_seterr("out of memory (merge map of %zu)", expected);
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = TOK_PAIR_EMPTY;
    return DFL_OK;
}

void tok_pairmap_free(struct tok_pairmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static size_t pair_slot(const struct tok_pairmap *m, uint64_t key) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    size_t mask = m->cap - 1;
    size_t i = (size_t)(h >> 32) & mask;
    while (m->slots[i].key != TOK_PAIR_EMPTY && m->slots[i].key != key) i = (i + 1) & mask;
    return i;
}

void tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = pair_key(a, b);
    struct tok_pairent *e = &m->slots[pair_slot(m, key)];
    if (e->key == TOK_PAIR_EMPTY) m->n++;
    e->key = key;
    e->rank = rank;
    e->id = id;
}

const struct tok_pairent *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    const struct tok_pairent *e = &m->slots[pair_slot(m, key)];
    return e->key == key ? e : NULL;
}

int tok_utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F; /* <= U+10FFFF */
    } else return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) return -k;
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -k;
    }
    return need + 1;
}

char *tok_utf8_lossy(const char *s, size_t n, size_t *out_len) {
    /* Each invalid byte grows to at most 3 bytes (U+FFFD). */
    char *out = malloc(3 * n + 1);
    if (!out) {
        dfl_seterr("out of memory (%zu bytes of text)", n);
        return NULL;
    }
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_char(u + i, n - i);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            o += (size_t)tok_utf8_put(out + o, 0xFFFD);
            i += (size_t)-k;
        }
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

int tok_utf8_put(char *out, uint32_t cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tok_match_added(const struct tok_matcher *m, const char *s, size_t n, const struct tok_added **hit) {
    if (m->start[256] == 0) return n;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++) {
        for (int32_t k = m->start[u[i]]; k < m->start[u[i] + 1]; k++) {
            const struct tok_added *t = m->toks[k];
            if (t->match_len <= n - i && memcmp(t->match, s + i, t->match_len) == 0) {
                *hit = t; /* longest first within the bucket */
                return i;
            }
        }
    }
    return n;
}
