/* Fuzz tokenizer.json loading (tok_open): any file either loads or is refused with a message
 * naming the file; a tokenizer that loads encodes a few fixed texts and (the first 256 bytes of)
 * the input itself to ids it owns, and decodes them to valid UTF-8. */
#include <string.h>

#include "dfl/common.h"
#include "dfl/tokenizer.h"
#include "fuzz_util.h"

static void check_text(const dfl_tokenizer *tok, const uint8_t *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    FUZZ_CHECK(tok_encode(tok, (const char *)text, len, &ids, &n) == DFL_OK, "tok_encode: %s", dfl_errmsg());
    const int32_t vs = tok_vocab_size(tok);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < vs && tok_has_id(tok, ids[i]), "id %d of %d not a token", ids[i], vs);
    for (int skip = 0; skip < 2; skip++) {
        size_t dl = 0;
        char *s = tok_decode_len(tok, ids, n, skip, &dl);
        FUZZ_CHECK(s != NULL, "tok_decode of its own ids: %s", dfl_errmsg());
        FUZZ_CHECK(s[dl] == 0 && fuzz_utf8_valid((const uint8_t *)s, dl), "decode gave invalid UTF-8");
        free(s);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    dfl_clearerr();
    dfl_tokenizer *tok = tok_open(path);
    if (!tok) {
        FUZZ_CHECK(strstr(dfl_errmsg(), path) != NULL, "error does not name the file: %s", dfl_errmsg());
        return 0;
    }
    static const char *const texts[] = {"",
                                        "a",
                                        "abc ab  a\n\n",
                                        "Hello world, 123!",
                                        "\xc3\xa9t\xc3\xa9 \xe4\xb8\xad",
                                        "<s>x</s><|im_start|>",
                                        "\xff\xfe bad \xc3"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        check_text(tok, (const uint8_t *)texts[i], strlen(texts[i]));
    check_text(tok, data, size < 256 ? size : 256);
    FUZZ_CHECK(tok_vocab_size(tok) >= 0, "vocab size");
    int32_t bad = tok_vocab_size(tok);
    char *s = tok_decode(tok, &bad, 1, 0);
    FUZZ_CHECK(s == NULL, "decoded an id outside the vocabulary");
    tok_close(tok);
    return 0;
}
