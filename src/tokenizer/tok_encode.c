/* Encoding: added tokens -> NFC -> Split regexes -> ByteLevel -> BPE, with a word cache.
 *
 * Invalid UTF-8 input is not an error: every maximal invalid subpart (Unicode's "substitution
 * of maximal subparts", as Python's bytes.decode("utf-8", "replace")) becomes U+FFFD before
 * anything else, so tok_encode(b) == HF encode(b.decode("utf-8", "replace")). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "dfl/common.h"
#include "tokenizer/tok_internal.h"

/* Word cache: pre-tokenized word (raw bytes) -> ids. Shared by all threads encoding with the
 * tokenizer, behind a mutex; emptied when full so memory stays bounded. */
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_MAX_WORD 128 /* longer words are rare and not worth caching */

struct tok_cache {
    pthread_mutex_t mu;
    struct {
        uint32_t hash, off; /* off: position in arena + 1; 0 = empty slot */
    } * slots;
    uint32_t n;
    uint32_t *arena; /* entries: key_len, n_ids, ids[n_ids], key bytes padded to 4 */
    size_t used, cap;
};

struct tok_cache *tok_cache_new(void) {
    struct tok_cache *c = calloc(1, sizeof *c);
    if (c) c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
    if (!c || !c->slots) {
        free(c);
        dfl_seterr("out of memory (word cache)");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void tok_cache_free(struct tok_cache *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    free(c->slots);
    free(c->arena);
    free(c);
}

struct sym {
    int32_t id, prev, next; /* id -1: merged into its left neighbour */
};

/* Per-call state: output ids and scratch buffers. */
struct enc {
    const dfl_tokenizer *tok;
    int32_t *ids;
    size_t n, cap;
    struct sym *syms;
    uint64_t *heap; /* (rank << 32 | position of the pair's left symbol), min-heap */
    size_t word_cap;
    char *mapped; /* the word as ByteLevel characters (ignore_merges lookups) */
    pcre2_match_data *md;
};

static int reserve_ids(struct enc *e, size_t k) {
    if (e->n + k <= e->cap) return DFL_OK;
    size_t cap = e->cap * 2 > e->n + k ? e->cap * 2 : e->n + k;
    int32_t *p = realloc(e->ids, cap * sizeof *p);
    if (!p) return dfl_seterr("out of memory (%zu ids)", cap);
    e->ids = p;
    e->cap = cap;
    return DFL_OK;
}

static int push_id(struct enc *e, int32_t id) {
    if (reserve_ids(e, 1)) return DFL_ERR;
    e->ids[e->n++] = id;
    return DFL_OK;
}

static uint32_t words_for(size_t key_len, uint32_t n_ids) { return 2 + n_ids + (uint32_t)(key_len + 3) / 4; }

/* 1 and the ids appended on a hit, 0 on a miss, DFL_ERR when out of memory. */
static int cache_get(struct tok_cache *c, uint32_t h, const char *key, size_t len, struct enc *e) {
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = h & (CACHE_SLOTS - 1); c->slots[i].off; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const uint32_t *w = c->arena + c->slots[i].off - 1;
        if (c->slots[i].hash != h || w[0] != len || memcmp(w + 2 + w[1], key, len) != 0) continue;
        rc = reserve_ids(e, w[1]) ? DFL_ERR : 1;
        if (rc == 1) {
            memcpy(e->ids + e->n, w + 2, w[1] * sizeof *w);
            e->n += w[1];
        }
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* cache_put's insertion, under c->mu. */
static void cache_insert(struct tok_cache *c, uint32_t h, const char *key, size_t len, const int32_t *ids, size_t n) {
    uint32_t need = words_for(len, (uint32_t)n);
    if (c->n >= CACHE_MAX_ENTRIES) {
        memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
        c->n = 0;
        c->used = 0;
    }
    if (c->used + need > c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 1u << 16;
        while (cap < c->used + need) cap *= 2;
        uint32_t *a = realloc(c->arena, cap * sizeof *a);
        if (!a) return;
        c->arena = a;
        c->cap = cap;
    }
    uint32_t i = h & (CACHE_SLOTS - 1);
    for (; c->slots[i].off; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const uint32_t *w = c->arena + c->slots[i].off - 1;
        if (c->slots[i].hash == h && w[0] == len && memcmp(w + 2 + w[1], key, len) == 0) return; /* a racing thread */
    }
    uint32_t *w = c->arena + c->used;
    w[0] = (uint32_t)len;
    w[1] = (uint32_t)n;
    memcpy(w + 2, ids, n * sizeof *ids);
    memcpy(w + 2 + n, key, len);
    c->slots[i].hash = h;
    c->slots[i].off = (uint32_t)c->used + 1;
    c->used += need;
    c->n++;
}

/* Best effort: a failed allocation only means the word is not cached. */
static void cache_put(struct tok_cache *c, uint32_t h, const char *key, size_t len, const int32_t *ids, size_t n) {
    pthread_mutex_lock(&c->mu);
    cache_insert(c, h, key, len, ids, n);
    pthread_mutex_unlock(&c->mu);
}

static void heap_push(uint64_t *heap, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && heap[(i - 1) / 2] > v) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = v;
}

static uint64_t heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0], v = heap[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= v) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = v;
    return top;
}

static void push_pair(const dfl_tokenizer *tok, const struct sym *s, int32_t i, uint64_t *heap, size_t *nh) {
    if (i < 0 || s[i].next < 0) return;
    const struct tok_pairent *p = tok_pairmap_get(&tok->merges, s[i].id, s[s[i].next].id);
    if (p) heap_push(heap, nh, (uint64_t)(uint32_t)p->rank << 32 | (uint32_t)i);
}

static int reserve_word(struct enc *e, size_t len) {
    if (len <= e->word_cap) return DFL_OK;
    size_t cap = len > 2 * e->word_cap ? len : 2 * e->word_cap;
    struct sym *s = realloc(e->syms, cap * sizeof *s);
    if (s) e->syms = s;
    uint64_t *h = realloc(e->heap, 3 * cap * sizeof *h); /* n - 1 initial pairs + 2 per merge */
    if (h) e->heap = h;
    char *m = realloc(e->mapped, 2 * cap); /* a ByteLevel character is 1 or 2 bytes */
    if (m) e->mapped = m;
    if (!s || !h || !m) return dfl_seterr("out of memory (word of %zu bytes)", len);
    e->word_cap = cap;
    return DFL_OK;
}

/* BPE as in HF: apply the lowest-ranked adjacent merge first, leftmost on ties. */
static int bpe_word(struct enc *e, const char *w, size_t len) {
    const dfl_tokenizer *tok = e->tok;
    const unsigned char *u = (const unsigned char *)w;
    uint32_t h = 0;
    if (len <= CACHE_MAX_WORD) {
        h = (uint32_t)tok_hash(w, len);
        int rc = cache_get(tok->cache, h, w, len, e);
        if (rc) return rc < 0 ? DFL_ERR : DFL_OK;
    }
    if (reserve_word(e, len)) return DFL_ERR;
    size_t start = e->n;
    struct sym *s = e->syms;
    int32_t n = 0;
    int last_unk = 0;
    size_t nh = 0;
    if (tok->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < len; i++) m += (size_t)tok_utf8_put(e->mapped + m, tok->byte_cp[u[i]]);
        int32_t id = tok_strmap_get(&tok->vocab, e->mapped, m);
        if (id >= 0) {
            if (push_id(e, id)) return DFL_ERR;
            goto done;
        }
    }
    /* One symbol per byte; bytes missing from the vocab become unk (fused if fuse_unk) or are
     * dropped when there is no unk token, like HF's BPE. */
    for (size_t i = 0; i < len; i++) {
        int32_t id = tok->byte_id[u[i]];
        int unk = id < 0;
        if (unk) {
            if (tok->unk_id < 0 || (tok->fuse_unk && last_unk)) continue;
            id = tok->unk_id;
        }
        last_unk = unk;
        s[n] = (struct sym){id, n - 1, n + 1};
        n++;
    }
    if (n == 0) goto done;
    s[n - 1].next = -1;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(tok, s, i, e->heap, &nh);
    while (nh > 0) {
        uint64_t top = heap_pop(e->heap, &nh);
        int32_t i = (int32_t)(uint32_t)top, j = s[i].next;
        if (s[i].id < 0 || j < 0) continue;
        const struct tok_pairent *p = tok_pairmap_get(&tok->merges, s[i].id, s[j].id);
        if (!p || (uint32_t)p->rank != (uint32_t)(top >> 32)) continue; /* stale entry */
        s[i].id = p->id;
        s[i].next = s[j].next;
        if (s[j].next >= 0) s[s[j].next].prev = i;
        s[j].id = -1;
        push_pair(tok, s, s[i].prev, e->heap, &nh);
        push_pair(tok, s, i, e->heap, &nh);
    }
    if (reserve_ids(e, (size_t)n)) return DFL_ERR;
    for (int32_t i = 0; i >= 0; i = s[i].next) e->ids[e->n++] = s[i].id;
done:
    if (len <= CACHE_MAX_WORD) cache_put(tok->cache, h, w, len, e->ids + start, e->n - start);
    return DFL_OK;
}

static int utf8_char_len(const char *s, size_t n) {
    int k = tok_utf8_char((const unsigned char *)s, n);
    return k > 0 ? k : -k;
}

/* Split s with regex number `level` (Isolated: matches and the gaps between them are pieces),
 * recursing into the next regex; the last level's pieces go to BPE. */
static int split_level(struct enc *e, int level, const char *s, size_t len) {
    if (len == 0) return DFL_OK;
    if (level == e->tok->n_splits) return bpe_word(e, s, len);
    const pcre2_code *re = e->tok->splits[level];
    size_t prev = 0, at = 0;
    while (at < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its backtracking on the heap */
            rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return dfl_seterr("pre_tokenizer regex %d failed on a %zu-byte piece: %s", level, len, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev && split_level(e, level + 1, s + prev, ms - prev)) return DFL_ERR;
        if (me > ms) {
            if (split_level(e, level + 1, s + ms, me - ms)) return DFL_ERR;
            prev = at = me;
        } else { /* an empty match only delimits */
            prev = ms;
            if (ms == len) break;
            at = ms + (size_t)utf8_char_len(s + ms, len - ms);
        }
    }
    return split_level(e, level + 1, s + prev, len - prev);
}

/* NFC'd text: split on the normalized added tokens, pre-tokenize the rest. */
static int encode_normalized(struct enc *e, const char *s, size_t len) {
    for (;;) {
        const struct tok_added *hit = NULL;
        size_t off = tok_match_added(&e->tok->norm_match, s, len, &hit);
        if (split_level(e, 0, s, off)) return DFL_ERR;
        if (!hit) return DFL_OK;
        if (push_id(e, hit->id)) return DFL_ERR;
        s += off + hit->match_len;
        len -= off + hit->match_len;
    }
}

/* NFC only where it can change anything. A character below U+0300 is its own NFC and never
 * composes with what precedes it, so only each maximal run of characters >= U+0300 (lead byte
 * >= 0xCC), together with the character before the run, goes through utf8proc. */
static int encode_segment(struct enc *e, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t first = 0;
    while (first < len && u[first] < 0xCC) first++;
    if (!e->tok->nfc || first == len) return encode_normalized(e, s, len);
    char *out = NULL;
    size_t n = 0, cap = 0, done = 0, prev = 0; /* prev: start of the last character seen */
    int rc = DFL_OK;
    for (size_t i = 0; i < len && rc == DFL_OK;) {
        if (u[i] < 0xCC) {
            prev = i;
            i += (size_t)utf8_char_len(s + i, len - i);
            continue;
        }
        size_t from = i > 0 ? prev : 0;
        while (i < len && u[i] >= 0xCC) i += (size_t)utf8_char_len(s + i, len - i);
        utf8proc_uint8_t *norm = NULL;
        utf8proc_ssize_t k =
            utf8proc_map(u + from, (utf8proc_ssize_t)(i - from), &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (k < 0) {
            rc = dfl_seterr("NFC of a %zu-byte run: %s", i - from, utf8proc_errmsg(k));
            break;
        }
        size_t need = n + (from - done) + (size_t)k + (len - i);
        if (need > cap) {
            cap = need > 2 * cap ? need : 2 * cap;
            char *o = realloc(out, cap);
            if (!o) rc = dfl_seterr("out of memory (NFC of %zu bytes)", len);
            else out = o;
        }
        if (rc == DFL_OK) {
            memcpy(out + n, s + done, from - done);
            n += from - done;
            memcpy(out + n, norm, (size_t)k);
            n += (size_t)k;
            done = i;
        }
        free(norm);
    }
    if (rc == DFL_OK) {
        memcpy(out + n, s + done, len - done);
        rc = encode_normalized(e, out, n + len - done);
    }
    free(out);
    return rc;
}

static int utf8_valid(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = tok_utf8_char(u + i, len - i);
        if (k < 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

int tok_encode(const dfl_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    char *fixed = NULL;
    if (!utf8_valid(text, len)) {
        if (!(fixed = tok_utf8_lossy(text, len, &len))) return DFL_ERR;
        text = fixed;
    }
    struct enc e = {.tok = tok, .cap = len / 3 + 16};
    e.ids = malloc(e.cap * sizeof *e.ids);
    e.md = pcre2_match_data_create(1, NULL);
    int rc = e.ids && e.md ? DFL_OK : dfl_seterr("out of memory (encoding %zu bytes)", len);
    /* Added tokens with normalized = false are found in the raw text, before NFC. */
    for (size_t pos = 0; rc == DFL_OK && pos <= len;) {
        const struct tok_added *hit = NULL;
        size_t off = tok_match_added(&tok->raw_match, text + pos, len - pos, &hit);
        rc = encode_segment(&e, text + pos, off);
        if (rc || !hit) break;
        rc = push_id(&e, hit->id);
        pos += off + hit->match_len;
    }
    free(fixed);
    free(e.syms);
    free(e.heap);
    free(e.mapped);
    pcre2_match_data_free(e.md);
    if (rc) {
        free(e.ids);
        return DFL_ERR;
    }
    *ids = e.ids;
    *n_ids = e.n;
    return DFL_OK;
}
