/* Fuzz encode/decode on a real Qwen tokenizer (the embedded models/target/tokenizer.json, or
 * $DFL_FUZZ_TOKENIZER, e.g. data/tokenizers/qwen3/tokenizer.json), asserting what
 * docs/tokenizer.md promises for arbitrary bytes b:
 *   - tok_encode(b) succeeds with ids of the vocabulary, and equals tok_encode of b with each
 *     maximal invalid UTF-8 subpart replaced by U+FFFD;
 *   - tok_decode(ids) is valid UTF-8 and canonically equivalent to that repaired text (equal
 *     under NFC); when b is valid UTF-8 already in NFC, it gives b back byte for byte;
 *   - decoding with skip_special equals decoding the ids without the special tokens;
 * and, reading the same bytes as a list of ids, decoding fails exactly when an id is not a token
 * and otherwise gives valid UTF-8. */
#include <string.h>

#include "dfl/common.h"
#include "dfl/tokenizer.h"
#include "fuzz_util.h"

static dfl_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *path = fuzz_tokenizer_path();
    tok = tok_open(path);
    FUZZ_CHECK(tok != NULL, "%s: %s", path, dfl_errmsg());
    return 0;
}

static void encode(const uint8_t *s, size_t n, int32_t **ids, size_t *n_ids) {
    FUZZ_CHECK(tok_encode(tok, (const char *)s, n, ids, n_ids) == DFL_OK, "tok_encode: %s", dfl_errmsg());
    const int32_t vs = tok_vocab_size(tok);
    for (size_t i = 0; i < *n_ids; i++)
        FUZZ_CHECK((*ids)[i] >= 0 && (*ids)[i] < vs && tok_has_id(tok, (*ids)[i]), "id %d is not a token", (*ids)[i]);
}

static void round_trip(const uint8_t *data, size_t size) {
    int32_t *ids = NULL;
    size_t n = 0;
    encode(data, size, &ids, &n);
    FUZZ_CHECK(size == 0 || n > 0, "%zu bytes encoded to no ids", size);

    size_t rl, dl, sl;
    uint8_t *rep = fuzz_utf8_repair(data, size, &rl);
    const int valid = rl == size && memcmp(rep, data, size) == 0;
    FUZZ_CHECK(valid == fuzz_utf8_valid(data, size), "repair and validation disagree");
    if (!valid) { /* encoding the bytes = encoding their repaired text */
        int32_t *ids2 = NULL;
        size_t n2 = 0;
        encode(rep, rl, &ids2, &n2);
        FUZZ_CHECK(n2 == n && memcmp(ids, ids2, n * sizeof *ids) == 0, "invalid UTF-8 encodes unlike its repair");
        free(ids2);
    }

    char *dec = tok_decode_len(tok, ids, n, 0, &dl);
    FUZZ_CHECK(dec != NULL, "decode of encoded ids: %s", dfl_errmsg());
    FUZZ_CHECK(dec[dl] == 0 && fuzz_utf8_valid((const uint8_t *)dec, dl), "decode gave invalid UTF-8");
    size_t nl, ndl;
    uint8_t *nfc = fuzz_nfc(rep, rl, &nl), *nfc_dec = fuzz_nfc((const uint8_t *)dec, dl, &ndl);
    FUZZ_CHECK(nl == ndl && memcmp(nfc, nfc_dec, nl) == 0,
               "decode(encode(b)) is not canonically equivalent to b (%zu bytes in, %zu out)", rl, dl);
    if (valid && nl == size && memcmp(nfc, data, size) == 0)
        FUZZ_CHECK(dl == size && memcmp(dec, data, size) == 0, "NFC text did not round-trip exactly");

    /* skip_special drops exactly the special tokens */
    int32_t *plain = malloc((n + 1) * sizeof *plain);
    size_t np = 0;
    for (size_t i = 0; i < n; i++)
        if (!tok_is_special(tok, ids[i])) plain[np++] = ids[i];
    char *a = tok_decode_len(tok, ids, n, 1, &sl), *b = tok_decode_len(tok, plain, np, 0, &dl);
    FUZZ_CHECK(a && b && sl == dl && memcmp(a, b, sl) == 0, "skip_special decode differs");
    free(a), free(b), free(plain), free(nfc), free(nfc_dec), free(dec), free(rep), free(ids);
}

/* The bytes as little-endian 16-bit ids spread over the vocabulary and a little beyond it. */
static void decode_ids(const uint8_t *data, size_t size) {
    const int32_t vs = tok_vocab_size(tok);
    size_t n = size / 2;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    int all_tokens = 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)data[2 * i] | (uint32_t)data[2 * i + 1] << 8;
        ids[i] = (int32_t)(v % (uint32_t)(vs + 8)) - (v >> 15 ? 4 : 0); /* a few negative and past-the-end */
        all_tokens &= ids[i] >= 0 && ids[i] < vs && tok_has_id(tok, ids[i]);
    }
    size_t dl = 0;
    char *s = tok_decode_len(tok, ids, n, (int)(size & 1), &dl);
    if (all_tokens) {
        FUZZ_CHECK(s != NULL, "decode of valid ids failed: %s", dfl_errmsg());
        FUZZ_CHECK(s[dl] == 0 && fuzz_utf8_valid((const uint8_t *)s, dl), "decode gave invalid UTF-8");
    } else {
        FUZZ_CHECK(s == NULL && dfl_errmsg()[0], "an id that is no token was decoded");
    }
    free(s);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    round_trip(data, size);
    decode_ids(data, size);
    return 0;
}
