/* Reading JSON-lines files (one JSON object per line): the loop every reader of a .jsonl file
 * shares — results, manifests, train rows, prompts, references.
 *
 *   dfl_jsonl r;
 *   if (dfl_jsonl_open(&r, path, 0)) return DFL_ERR;
 *   int rc;
 *   while ((rc = dfl_jsonl_next(&r)) == 1) { ... r.line, r.len, r.lineno ... }
 *   dfl_jsonl_close(&r);
 *
 * Files dfl writes end every line with '\n' as it is written; a last line without one is an
 * interrupted write, which next() leaves out (r.partial, r.good_end: where to cut). Files people
 * write may end without a newline: DFL_JSONL_LAST_LINE_OK returns that line too. */
#ifndef DFL_JSONL_H
#define DFL_JSONL_H

#include <stdio.h>

#include <cjson/cJSON.h>

enum {
    DFL_JSONL_MISSING_OK = 1,  /* a file that does not exist reads as empty */
    DFL_JSONL_LAST_LINE_OK = 2 /* a last line without its newline is a line */
};

typedef struct dfl_jsonl {
    const char *path;
    FILE *f; /* NULL: a missing file read as empty */
    int flags;
    int owned;  /* f was opened here: close() closes it */
    char *line; /* the current line, its "\n" and any "\r" before it removed; may hold NUL bytes (see len) */
    size_t cap;
    size_t len;    /* bytes in line */
    int lineno;    /* 1-based, blank lines counted */
    long start;    /* offset of the current line */
    long good_end; /* bytes up to the end of the last complete line read */
    int partial;   /* the file ended in a line without its newline, left out */
} dfl_jsonl;

/* Opens path; "PATH: cannot open: REASON" when it cannot (a missing file is no error with
 * DFL_JSONL_MISSING_OK). */
int dfl_jsonl_open(dfl_jsonl *r, const char *path, int flags);

/* Reads f, which the caller opened and closes (path: for messages). */
void dfl_jsonl_attach(dfl_jsonl *r, FILE *f, const char *path, int flags);

/* The next line that is not blank: 1; 0 at the end; DFL_ERR on a read error. */
int dfl_jsonl_next(dfl_jsonl *r);

/* The current line as exactly one JSON object (nothing but white space after it: "{..}{.." is
 * no line); NULL and the error "PATH:LINE: not a JSON object" when it is not. */
cJSON *dfl_jsonl_object(const dfl_jsonl *r);

void dfl_jsonl_close(dfl_jsonl *r);

#endif
