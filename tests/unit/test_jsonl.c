/* The JSON-lines reader every .jsonl file goes through (include/dfl/jsonl.h): blank lines and
 * "\r\n" endings, a partial last line left out of files dfl writes (with where to cut) and kept
 * in files people write, a missing file, NUL bytes, one object per line strictly. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/jsonl.h"
#include "testutil.h"

/* The lines next() returns from text (flags), joined by '|', and the reader's end state. */
static void read_all(const char *text, int flags, char *out, size_t n, dfl_jsonl *end) {
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    dfl_jsonl r;
    dfl_jsonl_attach(&r, f, "x.jsonl", flags);
    out[0] = 0;
    while (dfl_jsonl_next(&r) == 1) {
        char one[64];
        snprintf(one, sizeof one, "%s%d:%s", out[0] ? "|" : "", r.lineno, r.line);
        strncat(out, one, n - strlen(out) - 1);
    }
    *end = r;
    end->line = NULL;
    dfl_jsonl_close(&r);
    fclose(f);
}

static void lines(void) {
    char got[256];
    dfl_jsonl e;
    read_all("{\"a\": 1}\n\n  \t\n{\"b\": 2}\r\n{\"c\"", 0, got, sizeof got, &e);
    CHECK(strcmp(got, "1:{\"a\": 1}|4:{\"b\": 2}") == 0, "lines: %s", got);
    CHECK(e.partial == 1 && e.good_end == 24, "a partial last line is left out, cut at 24: %d %ld", e.partial,
          e.good_end);
    read_all("a b\r\r\n c\r\n", 0, got, sizeof got, &e); /* a prompt line's stray \r go too, as they always did */
    CHECK(strcmp(got, "1:a b|2: c") == 0, "carriage returns: %s", got);
    read_all("{\"a\": 1}\n{", 0, got, sizeof got, &e); /* a 1-byte partial line, once kept */
    CHECK(strcmp(got, "1:{\"a\": 1}") == 0 && e.partial && e.good_end == 9, "1-byte tail: %s %ld", got, e.good_end);
    read_all("{\"a\": 1}\n{\"b\": 2}", DFL_JSONL_LAST_LINE_OK, got, sizeof got, &e);
    CHECK(strcmp(got, "1:{\"a\": 1}|2:{\"b\": 2}") == 0 && !e.partial, "a person's file: %s", got);
    read_all("", 0, got, sizeof got, &e);
    CHECK(got[0] == 0 && e.good_end == 0 && !e.partial, "empty: %s", got);
}

static void objects(void) {
    const char text[] = "{\"a\": 1}  \n{\"a\": 1}{\"b\": 2}\n[1]\na\0b\n";
    FILE *f = fmemopen((void *)text, sizeof text - 1, "r");
    dfl_jsonl r;
    dfl_jsonl_attach(&r, f, "x.jsonl", 0);
    CHECK(dfl_jsonl_next(&r) == 1, "line 1");
    cJSON *o = dfl_jsonl_object(&r);
    CHECK(o && cJSON_GetObjectItem(o, "a")->valueint == 1, "an object with trailing blanks");
    cJSON_Delete(o);
    for (int line = 2; line <= 4; line++) {
        CHECK(dfl_jsonl_next(&r) == 1, "line %d", line);
        dfl_clearerr();
        CHECK(!dfl_jsonl_object(&r), "line %d is no object", line);
        char want[32];
        snprintf(want, sizeof want, "x.jsonl:%d: not a JSON object", line);
        CHECK(strstr(dfl_errmsg(), want), "line %d: %s", line, dfl_errmsg());
    }
    CHECK(r.len == 3 && r.line[1] == 0, "a NUL byte is kept in the line (len %zu)", r.len);
    CHECK(dfl_jsonl_next(&r) == 0, "end");
    dfl_jsonl_close(&r);
    fclose(f);
}

static void files(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/none.jsonl", test_tmpdir());
    dfl_jsonl r;
    CHECK(dfl_jsonl_open(&r, path, DFL_JSONL_MISSING_OK) == DFL_OK && dfl_jsonl_next(&r) == 0,
          "a missing file reads as empty");
    dfl_jsonl_close(&r);
    dfl_clearerr();
    CHECK(dfl_jsonl_open(&r, path, 0) != DFL_OK && strstr(dfl_errmsg(), "none.jsonl: cannot open"), "missing: %s",
          dfl_errmsg());
    FILE *f = fopen(path, "w");
    fputs("{\"a\": 1}\n", f);
    fclose(f);
    CHECK(dfl_jsonl_open(&r, path, 0) == DFL_OK && dfl_jsonl_next(&r) == 1 && r.lineno == 1 &&
              dfl_jsonl_next(&r) == 0 && r.good_end == 9,
          "a file: line %d, good_end %ld", r.lineno, r.good_end);
    dfl_jsonl_close(&r);
}

int main(void) {
    lines();
    objects();
    files();
    return test_done("test_jsonl");
}
