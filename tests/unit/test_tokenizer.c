/* Tokenizer unit tests: known Qwen3 encodings, invalid UTF-8, decoding (partial characters,
 * special tokens), BPE details on a hand-written tokenizer.json, concurrent encoding, and
 * malformed tokenizer.json files that must fail with a message naming the problem. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/tokenizer.h"
#include "testutil.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Encode and compare; returns 1 on a match. */
static int encodes_to(const dfl_tokenizer *tok, const char *text, size_t len, const int32_t *want, size_t n_want) {
    int32_t *ids;
    size_t n;
    if (tok_encode(tok, text, len, &ids, &n)) {
        fprintf(stderr, "  encode failed: %s\n", dfl_errmsg());
        return 0;
    }
    int ok = same_ids(ids, n, want, n_want);
    if (!ok) {
        fprintf(stderr, "  got:");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

static int decodes_to(const dfl_tokenizer *tok, const int32_t *ids, size_t n, int skip, const char *want,
                      size_t want_len) {
    size_t len;
    char *s = tok_decode_len(tok, ids, n, skip, &len);
    int ok = s && len == want_len && memcmp(s, want, len) == 0 && s[len] == 0;
    if (!ok) fprintf(stderr, "  decoded: %s\n", s ? s : dfl_errmsg());
    free(s);
    return ok;
}

struct known {
    const char *text, *nfc; /* nfc: what decode gives back, when it differs from text */
    int32_t ids[12];
    size_t n;
};

/* Expected ids were produced once with HF tokenizers 0.22.2 on the same tokenizer.json:
 * Tokenizer.from_file(path).encode(text).ids */
static const struct known known[] = {
    {"Hello world", NULL, {9707, 1879}, 2},
    {"<|im_start|>user\nhi<|im_end|>", NULL, {151644, 872, 198, 6023, 151645}, 5},
    {"12345", NULL, {16, 17, 18, 19, 20}, 5},
    {"e\xcc\x81", "\xc3\xa9", {963}, 1}, /* decomposed é: NFC first */
    {"\xc3\xa9", NULL, {963}, 1},
    {"DON'T you'LL they've", NULL, {84641, 17323, 498, 6, 4086, 807, 3003}, 7},
    {"\xe8\x87\xaa\xe7\x84\xb6\xe8\xaf\xad\xe8\xa8\x80\xe5\xa4\x84\xe7\x90\x86", NULL, {99795, 102064, 54542}, 3},
    {"\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd",
     NULL,
     {145367, 378, 235, 145233, 378, 235, 145665, 61804, 233, 145375},
     10},
    {"  \n\n  x", NULL, {18611, 220, 856}, 3},
    {"def f():\n\treturn 1", NULL, {750, 282, 3932, 853, 220, 16}, 6},
    {"", NULL, {0}, 0},
};

static void test_qwen3(const char *path) {
    dfl_tokenizer *tok = tok_open(path);
    CHECK(tok != NULL, "tok_open(%s): %s", path, dfl_errmsg());
    if (!tok) return;

    CHECK(tok_vocab_size(tok) == 151669, "vocab size %d", tok_vocab_size(tok));
    CHECK(tok_token_id(tok, "\xc4\xa0the") == 279, "id of 'Ġthe'");
    CHECK(tok_token_id(tok, "<|im_end|>") == 151645, "id of <|im_end|>");
    CHECK(tok_token_id(tok, "<think>") == 151667, "id of <think>");
    CHECK(tok_token_id(tok, "no such token") == -1, "absent token");
    CHECK(tok_is_special(tok, 151645) && !tok_is_special(tok, 151667) && !tok_is_special(tok, 279) &&
              !tok_is_special(tok, -1) && !tok_is_special(tok, 1 << 30),
          "tok_is_special");

    for (size_t i = 0; i < N_OF(known); i++) {
        const struct known *k = &known[i];
        CHECK(encodes_to(tok, k->text, strlen(k->text), k->ids, k->n), "encode \"%s\"", k->text);
        const char *back = k->nfc ? k->nfc : k->text;
        CHECK(decodes_to(tok, k->ids, k->n, 0, back, strlen(back)), "decode of \"%s\"", k->text);
    }

    /* Invalid UTF-8: each maximal invalid subpart is one U+FFFD (ids from HF on the repaired text). */
    static const int32_t abc_fffd_def[] = {13683, 5691, 750}; /* "abc\ufffddef" */
    static const int32_t fffd2[] = {9973};                    /* "\ufffd\ufffd" */
    CHECK(encodes_to(tok,
                     "abc\x80"
                     "def",
                     7, abc_fffd_def, 3),
          "lone continuation byte");
    CHECK(encodes_to(tok,
                     "abc\xe2\x82"
                     "def",
                     8, abc_fffd_def, 3),
          "truncated 3-byte sequence is one U+FFFD");
    CHECK(encodes_to(tok,
                     "abc\xf0\x9f\x98"
                     "def",
                     9, abc_fffd_def, 3),
          "truncated 4-byte sequence is one U+FFFD");
    CHECK(encodes_to(tok, "\xff\xfe", 2, fffd2, 1), "two invalid bytes are two U+FFFD");
    CHECK(encodes_to(tok, "\xc0\x80", 2, fffd2, 1), "overlong NUL is two U+FFFD");
    CHECK(encodes_to(tok, "\xed\xa0", 2, fffd2, 1), "surrogate prefix ED A0 is two U+FFFD");

    /* An embedded NUL is text like any other byte, and decodes back. */
    int32_t *ids;
    size_t n;
    CHECK(tok_encode(tok, "a\0b", 3, &ids, &n) == DFL_OK && n == 3, "encode with NUL");
    if (n == 3) CHECK(decodes_to(tok, ids, n, 0, "a\0b", 3), "decode with NUL");
    free(ids);

    /* Partial characters: "\u200d" is split across ids 378 (E2 80) and 235 (8D). */
    static const int32_t zwj[] = {378, 235};
    CHECK(decodes_to(tok, zwj, 2, 0, "\xe2\x80\x8d", 3), "ZWJ from two ids");
    CHECK(decodes_to(tok, zwj, 1, 0, "\xef\xbf\xbd", 3), "first half of ZWJ: one U+FFFD");
    CHECK(decodes_to(tok, zwj + 1, 1, 0, "\xef\xbf\xbd", 3), "second half of ZWJ: one U+FFFD");

    static const int32_t chat[] = {151644, 872, 198, 6023, 151645, 151667};
    CHECK(decodes_to(tok, chat, 6, 1, "user\nhi<think>", 14), "skip_special keeps non-special added tokens");
    static const int32_t bad_hi[] = {9707, 151669}, bad_neg[] = {-5};
    CHECK(tok_decode(tok, bad_hi, 2, 0) == NULL && strstr(dfl_errmsg(), "151669"), "id past the end: %s", dfl_errmsg());
    CHECK(tok_decode(tok, bad_neg, 1, 0) == NULL && strstr(dfl_errmsg(), "-5"), "negative id: %s", dfl_errmsg());

    /* Long inputs, including a long whitespace run (regex backtracking), twice (word cache). */
    size_t big = 1 << 20;
    char *text = malloc(big);
    for (size_t i = 0; i < big; i++) text[i] = i < big / 2 ? "The cat sat on 12 mats.\n"[i % 24] : " \n"[i % 7 == 0];
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK(tok_encode(tok, text, big, &a, &na) == DFL_OK && na > 0, "1 MiB input: %s", dfl_errmsg());
    CHECK(tok_encode(tok, text, big, &b, &nb) == DFL_OK && same_ids(a, na, b, nb), "1 MiB input, again");
    if (a) {
        size_t len;
        char *back = tok_decode_len(tok, a, na, 0, &len);
        CHECK(back && len == big && memcmp(back, text, big) == 0, "1 MiB round trip");
        free(back);
    }

    /* Concurrent encoding shares the word cache. */
    int bad = 0;
#pragma omp parallel for reduction(+ : bad)
    for (int t = 0; t < 64; t++) {
        int32_t *c;
        size_t nc;
        size_t off = (size_t)t * 4093, len = 64 * 1024;
        if (tok_encode(tok, text + off, len, &c, &nc) != DFL_OK) {
            bad++;
            continue;
        }
        size_t dl;
        char *d = tok_decode_len(tok, c, nc, 0, &dl);
        bad += !d || dl != len || memcmp(d, text + off, len) != 0;
        free(d);
        free(c);
    }
    CHECK(bad == 0, "%d of 64 concurrent encodes did not round-trip", bad);
    free(a);
    free(b);
    free(text);
    tok_close(tok);
}

static const char *write_file(const char *name, const char *content) {
    static char path[8][512];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 512, "%s/%s", test_tmpdir(), name);
    FILE *f = fopen(p, "w");
    if (!f) return p;
    fputs(content, f);
    fclose(f);
    return p;
}

#define TINY_HEAD                                                                                       \
    "{\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, " \
    "\"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}, "

/* BPE details on a hand-written vocabulary (expected results follow HF's BPE rules). */
static void test_tiny(void) {
    /* merges as legacy "a b" strings; "b c" outranks "a b", so "abc" is a + bc -> abc */
    const char *p = write_file(
        "tiny.json", TINY_HEAD
        "\"added_tokens\": [{\"id\": 9, \"content\": \"<s>\", \"special\": true, \"normalized\": false}],"
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5,"
        " \"\xc4\xa0\": 6, \"\xc4\xa0"
        "a\": 7, \"<unk>\": 8}, \"merges\": [\"b c\", \"a b\", \"a bc\", \"\xc4\xa0 a\"]}}");
    dfl_tokenizer *tok = tok_open(p);
    CHECK(tok != NULL, "tiny tokenizer: %s", dfl_errmsg());
    if (tok) {
        static const int32_t w1[] = {5, 3, 7, 0, 9, 5};
        /* 'x' has no vocab entry and there is no unk token: dropped, and its neighbours merge */
        static const int32_t w2[] = {3, 3, 7, 0};
        CHECK(encodes_to(tok, "abcab aa<s>abc", 14, w1, N_OF(w1)), "merge order");
        CHECK(encodes_to(tok, "abxab axa", 9, w2, N_OF(w2)), "missing bytes dropped, merges across them");
        CHECK(decodes_to(tok, w1, N_OF(w1), 1, "abcab aaabc", 11), "tiny decode, skip special");
        tok_close(tok);
    }
    /* unk_token with fuse_unk; ignore_merges takes whole-word vocab hits ("ac" is not mergeable) */
    p = write_file(
        "tiny_unk.json", TINY_HEAD
        "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"ignore_merges\": true,"
        " \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"ac\": 4, \"<unk>\": 5},"
        " \"merges\": [[\"a\", \"b\"]]}}");
    tok = tok_open(p);
    CHECK(tok != NULL, "tiny unk tokenizer: %s", dfl_errmsg());
    if (tok) {
        static const int32_t w[] = {5, 3, 5, 4}; /* "xy" -> one <unk>, "ab", "!" -> <unk>, "ac" */
        CHECK(encodes_to(tok, "xyab!ac", 7, w, N_OF(w)), "fused unk, ignore_merges");
        tok_close(tok);
    }
}

struct bad_case {
    const char *name, *json, *expect; /* expect: a substring of the error message */
};

static void test_malformed(void) {
    static const struct bad_case cases[] = {
        {"empty.json", "", "invalid JSON"},
        {"bad.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, ", "invalid JSON"},
        {"array.json", "[1, 2]", "top level"},
        {"nomodel.json", TINY_HEAD "\"added_tokens\": []}", "model: missing"},
        {"wordpiece.json", TINY_HEAD "\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "WordPiece"},
        {"vocabarr.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": [1], \"merges\": []}}", "model.vocab"},
        {"badid.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
         "model.vocab"},
        {"bigid.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1e300}, \"merges\": []}}",
         "model.vocab"},
        {"fracid.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0.5}, \"merges\": []}}",
         "model.vocab"},
        {"dupid.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}",
         "id 0"},
        {"merge.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a q\"]}}",
         "\"q\""},
        {"merge3.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a a\"]}}",
         "merges[0]"},
        {"nomerges.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "model.merges"},
        {"unk.json", TINY_HEAD "\"model\": {\"type\": \"BPE\", \"unk_token\": \"?\", \"vocab\": {}, \"merges\": []}}",
         "unk_token"},
        {"fallback.json",
         TINY_HEAD "\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}",
         "byte_fallback"},
        {"nfkc.json", "{\"normalizer\": {\"type\": \"NFKC\"}}", "NFKC"},
        {"pretok.json", "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "Whitespace"},
        {"prefix.json", "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true}}",
         "add_prefix_space"},
        {"removed.json",
         "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": "
         "false}]}}",
         "Removed"},
        {"regex.json",
         "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", "
         "\"add_prefix_space\": false}]}}",
         "cannot compile"},
        {"nobl.json",
         "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\"}]}}",
         "ByteLevel"},
        {"decoder.json",
         "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, \"decoder\": null}", "decoder"},
        {"lstrip.json",
         TINY_HEAD "\"added_tokens\": [{\"id\": 1, \"content\": \"<m>\", \"lstrip\": true}],"
                   "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "lstrip"},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        dfl_clearerr();
        dfl_tokenizer *tok = tok_open(write_file(cases[i].name, cases[i].json));
        CHECK(tok == NULL && strstr(dfl_errmsg(), cases[i].expect) && strstr(dfl_errmsg(), cases[i].name),
              "%s: expected an error with \"%s\", got \"%s\"", cases[i].name, cases[i].expect, dfl_errmsg());
        tok_close(tok);
    }
    CHECK(tok_open("/nonexistent/tokenizer.json") == NULL && strstr(dfl_errmsg(), "/nonexistent"), "missing file: %s",
          dfl_errmsg());
    CHECK(tok_open(test_tmpdir()) == NULL && strstr(dfl_errmsg(), "tokenizer.json"), "directory without one: %s",
          dfl_errmsg());
}

int main(void) {
    const char *data = getenv("DFL_DATA"); /* the repository's data/ (tests run from its root) */
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3", data ? data : "data");
    test_qwen3(path); /* a directory holding tokenizer.json */
    test_tiny();
    test_malformed();
    return test_done("test_tokenizer");
}
