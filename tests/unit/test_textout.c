/* Incremental detokenization of dfl serve (src/server/textout.c) on the real Qwen3 tokenizer:
 * text held back while a character is incomplete, stop strings found at the token that
 * completes them - also when that token ends with the first bytes of the next character, and
 * when the output ends there - and no stop matched on bytes that are not final. Ids and their
 * texts were read from HF tokenizers 0.22.2 ("Answer: 鑫" -> Answer : Ġé ĳ «). */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/tokenizer.h"
#include "server/server_internal.h"
#include "testutil.h"

static const int32_t ids[] = {16141, 25, 18137, 239, 104}; /* "Answer", ":", " \xe9", "\x91", "\xab" */
#define N_IDS 5

/* Pushes ids[0..n) with the given stop strings; returns the 1-based push that reported a stop
 * (0: none) and leaves the state in *t. */
static int run(textout *t, const dfl_tokenizer *tok, const char *stop, int n) {
    static char *stops[1]; /* textout keeps the pointer */
    stops[0] = (char *)stop;
    textout_init(t, tok, stop ? stops : NULL, stop ? 1 : 0);
    for (int i = 0; i < n; i++) {
        const int rc = textout_push(t, ids[i]);
        CHECK(rc >= 0, "push %d: %s", i, dfl_errmsg());
        if (rc == 1) return i + 1;
    }
    return 0;
}

static void check_final(const textout *t, const char *want, const char *what) {
    char *s = textout_final(t);
    CHECK(s && strcmp(s, want) == 0, "%s: final text '%s', want '%s'", what, s ? s : "(null)", want);
    free(s);
}

int main(void) {
    const char *data = getenv("DFL_DATA"); /* the repository's data/ (tests run from its root) */
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/qwen3", data ? data : "data");
    dfl_tokenizer *tok = tok_open(path);
    CHECK(tok != NULL, "tok_open %s: %s", path, dfl_errmsg());
    if (!tok) return test_done("test_textout");

    textout t;
    /* no stop: the incomplete character is held back, then released whole */
    CHECK(run(&t, tok, NULL, 3) == 0, "no stop reported");
    CHECK(t.len == 7 && memcmp(t.text, "Answer:", 7) == 0 && textout_safe(&t) == 7, "held back: '%.*s'", (int)t.len,
          t.text);
    check_final(&t, "Answer: \xef\xbf\xbd", "ends inside a character");
    for (int i = 3; i < N_IDS; i++) CHECK(textout_push(&t, ids[i]) == 0, "push %d", i);
    CHECK(t.len == strlen("Answer: \xe9\x91\xab") && strcmp(t.text, "Answer: \xe9\x91\xab") == 0, "completed: '%s'",
          t.text);
    textout_free(&t);

    /* ": " is complete with the token " \xe9", which also starts the next character */
    CHECK(run(&t, tok, ": ", 3) == 3, "stop ': ' at the third token");
    CHECK(t.stop_at == 6 && t.stop_idx == 0 && textout_safe(&t) == 6, "stop_at %ld", t.stop_at);
    check_final(&t, "Answer", "stop before an unfinished character");
    textout_free(&t);

    /* a stop string spanning final text and the held-back token */
    CHECK(run(&t, tok, "wer: ", N_IDS) == 3, "stop 'wer: ' at the third token");
    check_final(&t, "Ans", "stop across the held-back token");
    textout_free(&t);

    /* the placeholder of an incomplete character never matches, and a stop made of the whole
     * character is found at its last token */
    CHECK(run(&t, tok, ": \xef\xbf\xbd", N_IDS) == 0, "no match on a replacement character");
    check_final(&t, "Answer: \xe9\x91\xab", "no stop");
    textout_free(&t);
    CHECK(run(&t, tok, "\xe9\x91\xab", N_IDS) == 5, "multi-byte stop at its last token");
    check_final(&t, "Answer: ", "multi-byte stop");
    textout_free(&t);
    CHECK(run(&t, tok, ": X", 3) == 0 && textout_safe(&t) == 6, "a possible stop start is held back (safe %zu)",
          textout_safe(&t));
    textout_free(&t);

    tok_close(tok);
    return test_done("test_textout");
}
