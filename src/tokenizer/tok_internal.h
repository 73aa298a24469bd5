/* Internals of the byte-level BPE tokenizer shared by tok_load.c, tok_encode.c, tok_decode.c
 * and tok_util.c. */
#ifndef DFL_TOK_INTERNAL_H
#define DFL_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "dfl/tokenizer.h"

/* Open-addressing string -> int32 map. Keys are borrowed: the tokenizer owns the strings. */
struct tok_strent {
    const char *key; /* NULL: empty slot */
    uint32_t len;
    int32_t val;
};
struct tok_strmap {
    struct tok_strent *slots;
    size_t cap, n; /* cap is a power of two */
};

/* (left id, right id) -> (merge rank, merged id). */
struct tok_pairent {
    uint64_t key; /* TOK_PAIR_EMPTY: empty slot */
    int32_t rank, id;
};
struct tok_pairmap {
    struct tok_pairent *slots;
    size_t cap, n;
};
#define TOK_PAIR_EMPTY UINT64_MAX

struct tok_added {
    char *content; /* as written in tokenizer.json: what decode produces */
    size_t len;
    char *match; /* what encode matches: content, NFC'd when normalized and the normalizer is NFC */
    size_t match_len;
    int32_t id;
    int special, normalized;
};

/* Leftmost-longest matcher over a set of added tokens: toks sorted by first byte, then by
 * length descending, so toks[start[b]..start[b+1]) are the candidates starting with byte b. */
struct tok_matcher {
    const struct tok_added **toks;
    int32_t start[257];
};

struct tok_cache;

struct dfl_tokenizer {
    char **id_tok;     /* id -> model vocab string; NULL: not in the model vocab */
    int32_t *id_added; /* id -> index in added[] (wins over id_tok when decoding), -1 if none */
    int32_t n_ids;     /* max id + 1 */
    struct tok_strmap vocab, added_ids;
    struct tok_pairmap merges;
    struct tok_added *added;
    int32_t n_added;
    struct tok_matcher raw_match;  /* added tokens with normalized = false: matched on raw text */
    struct tok_matcher norm_match; /* normalized = true: matched after NFC */
    int nfc;
    pcre2_code **splits; /* Split regexes applied in sequence (ByteLevel use_regex adds GPT-2's) */
    int n_splits;
    uint32_t byte_cp[256]; /* ByteLevel: byte -> code point of its printable stand-in */
    int16_t cp_byte[324];  /* the inverse; -1 for code points that stand for no byte */
    int32_t byte_id[256];  /* byte -> vocab id of its stand-in, -1 if absent */
    int32_t unk_id;        /* -1: characters missing from the vocab are dropped (as HF does) */
    int fuse_unk, ignore_merges;
    struct tok_cache *cache;
};

uint64_t tok_hash(const void *p, size_t n);

int tok_strmap_init(struct tok_strmap *m, size_t expected);
void tok_strmap_free(struct tok_strmap *m);
/* Insert or overwrite. The map never fills: it is sized for `expected` at init. */
void tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t val);
int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len); /* -1 if absent */

int tok_pairmap_init(struct tok_pairmap *m, size_t expected);
void tok_pairmap_free(struct tok_pairmap *m);
void tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const struct tok_pairent *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b);

/* Length of the well-formed UTF-8 character at s[0..n) (n > 0), or minus the length of the
 * maximal invalid subpart there (the unit that becomes one U+FFFD in Unicode's "substitution of
 * maximal subparts", which Python's errors="replace" and Rust's from_utf8_lossy follow). */
int tok_utf8_char(const unsigned char *s, size_t n);
/* Copy of s[0..n) with each maximal invalid subpart replaced by U+FFFD; malloc'd, NUL-terminated,
 * length in *out_len. NULL + error when out of memory. */
char *tok_utf8_lossy(const char *s, size_t n, size_t *out_len);
/* Append the UTF-8 encoding of cp to out; returns the number of bytes (1..4). */
int tok_utf8_put(char *out, uint32_t cp);

/* Find the leftmost-longest added token in s[0..n). Returns its start offset, or n if none;
 * *hit is the token. */
size_t tok_match_added(const struct tok_matcher *m, const char *s, size_t n, const struct tok_added **hit);

/* The word cache used by tok_encode (tok_encode.c). */
struct tok_cache *tok_cache_new(void);
void tok_cache_free(struct tok_cache *c);

#endif
