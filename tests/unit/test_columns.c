/* The columns table of results.jsonl (src/eval/columns.h): every row, a new one included, is
 * written, read back to the same value, refused when its value is bad, left out when unset (when
 * the row says so), aggregated as the row says, and consistent with the summary it feeds. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"
#include "eval/columns.h"
#include "testutil.h"

static char *written(const eval_result *r) {
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    eval_result_write(f, r, NULL, 0);
    fclose(f);
    return strdup(buf);
}

/* A value of column c unlike eval_result_init's, into r. */
static void set_other(const eval_column *c, eval_result *r) {
    void *p = (char *)r + c->off;
    switch (c->type) {
    case COL_STR: snprintf(p, c->size, "a \"quoted\" \\ value"); break;
    case COL_INT: *(int *)p = (int)c->lo + 1; break;
    case COL_LONG: *(long *)p = (long)c->lo + 1; break;
    case COL_SECONDS: *(double *)p = 1.5; break;
    case COL_BOOL: *(int *)p = 0; break;
    case COL_NAME: *(int *)p = c->n_names - 1; break;
    case COL_DERIVED: break;
    }
}

static size_t field_size(const eval_column *c) {
    return c->type == COL_STR       ? c->size
           : c->type == COL_LONG    ? sizeof(long)
           : c->type == COL_SECONDS ? sizeof(double)
                                    : sizeof(int);
}

static int has_key(const char *line, const eval_column *c) {
    char key[64];
    snprintf(key, sizeof key, "\"%s\": ", c->key);
    return strstr(line, key) != NULL;
}

/* The line of r with column c's value replaced by `value` (NULL: the member left out); r's strings
 * hold no quotes. */
static char *with_value(const eval_result *r, const eval_column *c, const char *value) {
    char *line = written(r), key[64], *out = malloc(strlen(line) + 64);
    snprintf(key, sizeof key, "\"%s\": ", c->key);
    const char *at = strstr(line, key), *end = at + strlen(key);
    if (*end == '"') end = strchr(end + 1, '"') + 1;
    while (*end != ',' && *end != '}') end++;
    size_t start = (size_t)(at - line), stop = (size_t)(end - line);
    if (!value && line[start - 1] == ' ') start -= 2; /* the ", " before it */
    else if (!value && line[stop] == ',') stop += 2;  /* the first member: the ", " after it */
    sprintf(out, "%.*s%s%s%s", (int)start, line, value ? key : "", value ? value : "", line + stop);
    free(line);
    return out;
}

static void check_row(const eval_column *c) {
    eval_result r, back;
    eval_result_init(&r);
    char *line = written(&r);
    CHECK(has_key(line, c) != ((c->flags & COL_IF_SET) == COL_IF_SET), "%s: written when unset: %s", c->key, line);
    free(line);
    if (c->type == COL_DERIVED) return;
    if ((c->flags & COL_IF_SET) == COL_IF_SET) set_other(c, &r); /* present, to be replaced or left out */
    char *bad = with_value(&r, c, "{}");
    CHECK(c->type == COL_BOOL || (eval_result_parse(bad, &back, NULL, NULL) == DFL_ERR && strstr(dfl_errmsg(), c->key)),
          "%s: an object as its value: %s", c->key, bad);
    free(bad);
    char *absent = with_value(&r, c, NULL);
    const int ok = eval_result_parse(absent, &back, NULL, NULL) == DFL_OK;
    CHECK(ok == (c->type == COL_BOOL || (c->flags & COL_OPTIONAL)), "%s: read without it: %d (%s)", c->key, ok, absent);
    free(absent);
    if ((c->flags & COL_NULLABLE) == COL_NULLABLE) {
        eval_result init;
        eval_result_init(&init);
        char *null = with_value(&r, c, "null");
        CHECK(eval_result_parse(null, &back, NULL, NULL) == DFL_OK &&
                  memcmp((char *)&init + c->off, (char *)&back + c->off, field_size(c)) == 0,
              "%s: null does not read as absent: %s", c->key, null);
        free(null);
    }
    set_other(c, &r);
    line = written(&r);
    CHECK(eval_result_parse(line, &back, NULL, NULL) == DFL_OK, "%s: %s", c->key, dfl_errmsg());
    CHECK(memcmp((char *)&r + c->off, (char *)&back + c->off, field_size(c)) == 0, "%s: not read back: %s", c->key,
          line);
    free(line);
}

static void check_agg(const eval_column *c) {
    CHECK((c->stat != STAT_NONE) == (c->stat_key != NULL), "%s: a summary member needs a key", c->key);
    CHECK(c->stat == STAT_NONE || c->agg != AGG_NONE, "%s: a summary member of no aggregate", c->key);
    CHECK(!c->md_title || c->agg != AGG_NONE, "%s: a summary.md table of no aggregate", c->key);
    CHECK(c->stat != STAT_SHARE || c->type == COL_SECONDS, "%s: a share of something not a time", c->key);
    if (c->agg == AGG_NONE) return;
    eval_result r;
    eval_result_init(&r);
    set_other(c, &r);
    eval_agg a;
    memset(&a, 0, sizeof a);
    eval_columns_add(&a, &r);
    eval_columns_add(&a, &r);
    const double v = c->type == COL_LONG      ? (double)*(long *)((char *)&r + c->off)
                     : c->type == COL_SECONDS ? *(double *)((char *)&r + c->off)
                                              : *(int *)((char *)&r + c->off);
    const double want = c->agg == AGG_SUM ? 2 * v : c->agg == AGG_MAX ? v : 2; /* AGG_COUNT_FALSE: both false */
    CHECK(eval_column_agg(c, &a) == want, "%s: aggregate %g, want %g", c->key, eval_column_agg(c, &a), want);
}

int main(void) {
    for (int i = 0; i < eval_n_columns; i++) {
        for (int j = 0; j < i; j++)
            CHECK(strcmp(eval_columns[i].key, eval_columns[j].key) != 0, "key %s twice", eval_columns[i].key);
        check_row(&eval_columns[i]);
        check_agg(&eval_columns[i]);
    }
    return test_done("test_columns");
}
