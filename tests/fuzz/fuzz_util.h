/* Helpers shared by the libFuzzer harnesses of tests/fuzz/. */
#ifndef DFL_FUZZ_UTIL_H
#define DFL_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A property every input must keep: report and abort (libFuzzer saves the input as a crash). */
#define FUZZ_CHECK(cond, ...)                                                             \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* The parsers take paths: an in-memory file (memfd) holding data, as "/proc/self/fd/N". The
 * same file is rewritten on every call of one slot (0..3). */
const char *fuzz_file(int slot, const uint8_t *data, size_t size);
/* A malloc'd NUL-terminated copy of data (embedded NUL bytes end the C string early). */
char *fuzz_cstr(const uint8_t *data, size_t size);
/* 1 if s[0..n) is valid UTF-8 (shortest forms, no surrogates, <= U+10FFFF). */
int fuzz_utf8_valid(const uint8_t *s, size_t n);
/* s with every maximal invalid subpart replaced by U+FFFD (Unicode's substitution of maximal
 * subparts, as Python's bytes.decode("utf-8", "replace")); malloc'd, length in *out_len. */
uint8_t *fuzz_utf8_repair(const uint8_t *s, size_t n, size_t *out_len);
/* NFC of valid UTF-8 s[0..n) (NUL bytes included) via utf8proc; malloc'd, length in *out_len. */
uint8_t *fuzz_nfc(const uint8_t *s, size_t n, size_t *out_len);
/* A tokenizer.json for the round-trip harness: $DFL_FUZZ_TOKENIZER, else the embedded
 * models/target/tokenizer.json of the source tree. */
const char *fuzz_tokenizer_path(void);

#endif
