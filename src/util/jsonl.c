/* JSON-lines reading (include/dfl/jsonl.h). */
#include "dfl/jsonl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"

int dfl_jsonl_open(dfl_jsonl *r, const char *path, int flags) {
    memset(r, 0, sizeof *r);
    r->path = path, r->flags = flags;
    r->f = fopen(path, "r"), r->owned = 1;
    if (!r->f && !(errno == ENOENT && (flags & DFL_JSONL_MISSING_OK)))
        return dfl_seterr("%s: cannot open: %s", path, strerror(errno));
    return DFL_OK;
}

void dfl_jsonl_attach(dfl_jsonl *r, FILE *f, const char *path, int flags) {
    memset(r, 0, sizeof *r);
    r->f = f, r->path = path, r->flags = flags;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r", s[i]) || !s[i]) return 0;
    return 1;
}

int dfl_jsonl_next(dfl_jsonl *r) {
    if (!r->f) return 0;
    ssize_t len;
    while (r->start = r->good_end, (len = getline(&r->line, &r->cap, r->f)) >= 0) {
        r->lineno++;
        const int complete = r->line[len - 1] == '\n';
        if (!complete && !(r->flags & DFL_JSONL_LAST_LINE_OK)) {
            r->partial = 1;
            return 0;
        }
        if (complete) r->good_end += len, len--;
        while (len > 0 && r->line[len - 1] == '\r') len--; /* "\r\n", and stray "\r"s before it */
        r->line[len] = 0, r->len = (size_t)len;
        if (!blank(r->line, r->len)) return 1;
    }
    if (ferror(r->f)) return dfl_seterr("%s: read error after line %d", r->path, r->lineno);
    return 0;
}

cJSON *dfl_jsonl_object(const dfl_jsonl *r) {
    cJSON *o = memchr(r->line, 0, r->len) ? NULL : cJSON_ParseWithOpts(r->line, NULL, 1);
    if (cJSON_IsObject(o)) return o;
    cJSON_Delete(o);
    dfl_seterr("%s:%d: not a JSON object", r->path, r->lineno);
    return NULL;
}

void dfl_jsonl_close(dfl_jsonl *r) {
    if (r->f && r->owned) fclose(r->f);
    free(r->line);
    r->f = NULL, r->line = NULL;
}
