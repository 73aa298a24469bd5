/* The table of results.jsonl's scalar columns (columns.h) and what reads it: writing, parsing and
 * aggregating a column. */
#include "columns.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "dfl/backend.h"
#include "dfl/common.h"

/* Zero, but a compile error unless field f of struct S has type T (a string buffer: char *): a
 * row's type and its field's cannot drift apart. */
#define TYPE_IS(T, S, f) (0 * sizeof(char[_Generic(((S *)0)->f, T : 1)]))
#define AT(T, f) .off = offsetof(eval_result, f) + TYPE_IS(T, eval_result, f)

#define STR_COL(k, f) .key = k, .type = COL_STR, AT(char *, f), .size = sizeof((eval_result *)0)->f
#define INT_COL(k, f, l, h) .key = k, .type = COL_INT, AT(int, f), .lo = l, .hi = h
#define LONG_COL(k, f, l, h) .key = k, .type = COL_LONG, AT(long, f), .lo = l, .hi = h
#define SECONDS_COL(k, f) .key = k, .type = COL_SECONDS, AT(double, f)
#define BOOL_COL(k, f) .key = k, .type = COL_BOOL, AT(int, f)
#define NAME_COL(k, f, fn, n) .key = k, .type = COL_NAME, AT(int, f), .name = fn, .n_names = n

/* A sum goes into the eval_agg field of the same name and type; a maximum or a count into an int. */
#define TYPE_CODE(x) _Generic((x), int : 1, long : 2, double : 3, default : 0)
#define SUM(f)                         \
    .agg = AGG_SUM,                    \
    .agg_off = offsetof(eval_agg, f) + \
               0 * sizeof(char[TYPE_CODE(((eval_agg *)0)->f) == TYPE_CODE(((eval_result *)0)->f) ? 1 : -1])
#define INTO(how, f) .agg = how, .agg_off = offsetof(eval_agg, f) + TYPE_IS(int, eval_agg, f)
#define SHOW(how, k) .stat = how, .stat_key = k

static const char *act_name(int bf16) { return bf16 ? "bf16" : "f32"; }
static const char *device_name(int d) { return dfl_device_name((dfl_device)d); }
static double tau_of(const eval_result *r) { return r->rounds ? (double)(r->tokens - 1) / r->rounds : 0.0; }

/* In the order of a line. */
const eval_column eval_columns[] = {
    {STR_COL("prompt_id", prompt_id)},
    {INT_COL("turn", turn, 0, 1)},
    {INT_COL("rep", rep, 0, EVAL_MAX_REPEAT - 1), .flags = COL_IF_SET}, /* absent: the first (or only) run */
    {NAME_COL("act", act_bf16, act_name, 2), .flags = COL_IF_SET},      /* absent: float32 activations */
    /* any device's name, built here or not (a merge or summary of another machine's run); absent: the CPU */
    {NAME_COL("device", device, device_name, DFL_DEVICE_COUNT), .flags = COL_IF_SET},
    {STR_COL("drafter", drafter)},
    {STR_COL("mode", mode)},
    {INT_COL("tokens", tokens, 0, INT_MAX), SUM(tokens), SHOW(STAT_TOTAL, "tokens")},
    {INT_COL("rounds", rounds, 0, INT_MAX), SUM(rounds), SHOW(STAT_TOTAL, "rounds")},
    {LONG_COL("drafted", drafted, 0, RES_MAX_INT), SUM(drafted), SHOW(STAT_TOTAL, "drafted")},
    {LONG_COL("accepted", accepted, 0, RES_MAX_INT), SUM(accepted), SHOW(STAT_TOTAL, "accepted")},
    {INT_COL("block_size", max_block, 0, DFL_MAX_BLOCK), INTO(AGG_MAX, max_block)},
    {.key = "tau", .type = COL_DERIVED, .derive = tau_of},
    {SECONDS_COL("time_s", time_s), SUM(time_s)},
    {SECONDS_COL("prefill_s", prefill_s), SUM(prefill_s)},
    {SECONDS_COL("draft_s", draft_s), SUM(draft_s), SHOW(STAT_SHARE, "draft_share")},
    {SECONDS_COL("verify_s", verify_s), SUM(verify_s), SHOW(STAT_SHARE, "verify_share")},
    {SECONDS_COL("rollback_s", rollback_s), SUM(rollback_s), SHOW(STAT_SHARE, "rollback_share")},
    {LONG_COL("tree_depth_sum", tree_depth_sum, 0, RES_MAX_INT), SUM(tree_depth_sum),
     SHOW(STAT_PER_ROUND, "mean_tree_depth")},
    {BOOL_COL("match", match), INTO(AGG_COUNT_FALSE, mismatches), SHOW(STAT_COUNT, "mismatches"),
     .md_title = "mismatches vs autoregressive"},
    {INT_COL("first_mismatch", first_mismatch, -1, INT_MAX)},
    {STR_COL("method", method), .flags = COL_OPTIONAL},
    {STR_COL("features", features), .flags = COL_OPTIONAL},
    {LONG_COL("tree_nodes", tree_nodes, 0, RES_MAX_INT), .flags = COL_NULLABLE, SUM(tree_nodes),
     SHOW(STAT_PER_ROUND, "mean_tree_nodes")},
    /* the modeled times: eval_summarize sums them itself (a response counts when it has both) */
    {SECONDS_COL("modeled_s", modeled_s), .flags = COL_NULLABLE | COL_IF_SET},
    {SECONDS_COL("modeled_ar_s", modeled_ar_s), .flags = COL_NULLABLE | COL_IF_SET},
};
const int eval_n_columns = (int)(sizeof eval_columns / sizeof *eval_columns);

#define FIELD(T, base, off) ((T *)((char *)(base) + (off)))
#define CFIELD(T, base, off) ((const T *)((const char *)(base) + (off)))

static int has(const eval_column *c, int flag) { return (c->flags & flag) == flag; }

static int is_set(const eval_column *c, const eval_result *r) {
    if (c->type == COL_SECONDS) return *CFIELD(double, r, c->off) >= 0;
    return *CFIELD(int, r, c->off) != 0; /* COL_IF_SET is on int columns and times only */
}

static void write_one(FILE *f, const eval_column *c, const eval_result *r) {
    const void *p = (const char *)r + c->off;
    switch (c->type) {
    case COL_STR: dfl_json_write_string(f, p); break;
    case COL_INT: fprintf(f, "%d", *(const int *)p); break;
    case COL_LONG: fprintf(f, "%ld", *(const long *)p); break;
    case COL_SECONDS: fprintf(f, "%.6f", *(const double *)p); break;
    case COL_BOOL: fputs(*(const int *)p < 0 ? "null" : *(const int *)p ? "true" : "false", f); break;
    case COL_NAME: fprintf(f, "\"%s\"", c->name(*(const int *)p)); break;
    case COL_DERIVED: fprintf(f, "%.6f", c->derive(r)); break;
    }
}

void eval_columns_write(FILE *f, const eval_result *r) {
    int first = 1;
    for (int i = 0; i < eval_n_columns; i++) {
        const eval_column *c = &eval_columns[i];
        if (has(c, COL_IF_SET) && !is_set(c, r)) continue;
        fprintf(f, "%s\"%s\": ", first ? "" : ", ", c->key);
        write_one(f, c, r);
        first = 0;
    }
}

int col_int_of(const cJSON *x, double lo, double hi, double *v) {
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi) ||
        x->valuedouble != floor(x->valuedouble))
        return -1;
    *v = x->valuedouble;
    return 0;
}

/* "expected \"a\", \"b\" or \"c\"": the names a COL_NAME column takes. */
static int bad_name(const eval_column *c) {
    char list[256] = "";
    for (int i = 0, len = 0; i < c->n_names && len < (int)sizeof list; i++)
        len += snprintf(list + len, sizeof list - (size_t)len, "%s\"%s\"",
                        !i                   ? ""
                        : i + 1 < c->n_names ? ", "
                                             : " or ",
                        c->name(i));
    return dfl_seterr("field %s: expected %s", c->key, list);
}

/* A present value x of column c into r. */
static int parse_one(const eval_column *c, const cJSON *x, eval_result *r) {
    void *p = (char *)r + c->off;
    const int must = has(c, COL_NULLABLE); /* errors say "must be": it may be absent */
    double v;
    switch (c->type) {
    case COL_STR:
        if (!cJSON_IsString(x)) return dfl_seterr("field '%s' must be a string", c->key);
        snprintf(p, c->size, "%s", x->valuestring);
        return DFL_OK;
    case COL_INT:
    case COL_LONG:
        if (col_int_of(x, c->lo, c->hi, &v))
            return dfl_seterr(must ? "field '%s' must be an integer in [%.0f, %.0f]"
                                   : "field '%s' missing or not an integer in [%.0f, %.0f]",
                              c->key, c->lo, c->hi);
        if (c->type == COL_INT) *(int *)p = (int)v;
        else *(long *)p = (long)v;
        return DFL_OK;
    case COL_SECONDS: /* finite: inf or nan could not be written back as JSON */
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
            return dfl_seterr(must ? "field '%s' must be a finite number" : "field '%s' missing or not a finite number",
                              c->key);
        *(double *)p = x->valuedouble;
        return DFL_OK;
    case COL_BOOL: *(int *)p = cJSON_IsBool(x) ? cJSON_IsTrue(x) : -1; return DFL_OK;
    case COL_NAME:
        for (int i = 0; cJSON_IsString(x) && i < c->n_names; i++)
            if (strcmp(x->valuestring, c->name(i)) == 0) return *(int *)p = i, DFL_OK;
        return bad_name(c);
    case COL_DERIVED: break;
    }
    return DFL_OK;
}

/* The strings that name a response (every line has them) come first, with one message for all. */
static int parse_names(const cJSON *o) {
    const char *keys[8];
    int n = 0, bad = 0;
    for (int i = 0; i < eval_n_columns && n < 8; i++)
        if (eval_columns[i].type == COL_STR && !(eval_columns[i].flags & COL_OPTIONAL)) {
            keys[n++] = eval_columns[i].key;
            bad |= !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, eval_columns[i].key));
        }
    if (!bad) return DFL_OK;
    char list[256] = "";
    for (int k = 0, len = 0; k < n && len < (int)sizeof list; k++)
        len += snprintf(list + len, sizeof list - (size_t)len, "%s%s", !k ? "" : k + 1 < n ? ", " : " and ", keys[k]);
    return dfl_seterr("fields %s must be strings", list);
}

int eval_columns_parse(const cJSON *o, eval_result *r) {
    if (parse_names(o)) return DFL_ERR;
    for (int i = 0; i < eval_n_columns; i++) {
        const eval_column *c = &eval_columns[i];
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, c->key);
        if (c->type == COL_DERIVED || (!x && (c->flags & COL_OPTIONAL)) || (cJSON_IsNull(x) && has(c, COL_NULLABLE)))
            continue;
        if (parse_one(c, x, r)) return DFL_ERR;
    }
    return DFL_OK;
}

void eval_columns_add(eval_agg *a, const eval_result *r) {
    for (int i = 0; i < eval_n_columns; i++) {
        const eval_column *c = &eval_columns[i];
        const void *v = (const char *)r + c->off;
        switch (c->agg) {
        case AGG_NONE: break;
        case AGG_SUM:
            if (c->type == COL_LONG) *FIELD(long, a, c->agg_off) += *(const long *)v;
            else if (c->type == COL_SECONDS) *FIELD(double, a, c->agg_off) += *(const double *)v;
            else *FIELD(int, a, c->agg_off) += *(const int *)v;
            break;
        case AGG_MAX:
            if (*(const int *)v > *FIELD(int, a, c->agg_off)) *FIELD(int, a, c->agg_off) = *(const int *)v;
            break;
        case AGG_COUNT_FALSE: *FIELD(int, a, c->agg_off) += *(const int *)v == 0; break;
        }
    }
}

/* The type of the aggregate: the column's when summed, else an int. */
static col_type agg_type(const eval_column *c) { return c->agg == AGG_SUM ? c->type : COL_INT; }

double eval_column_agg(const eval_column *c, const eval_agg *a) {
    switch (agg_type(c)) {
    case COL_LONG: return (double)*CFIELD(long, a, c->agg_off);
    case COL_SECONDS: return *CFIELD(double, a, c->agg_off);
    default: return *CFIELD(int, a, c->agg_off);
    }
}

void eval_column_agg_write(FILE *f, const eval_column *c, const eval_agg *a) {
    switch (agg_type(c)) {
    case COL_LONG: fprintf(f, "%ld", *CFIELD(long, a, c->agg_off)); break;
    case COL_SECONDS: fprintf(f, "%.6f", *CFIELD(double, a, c->agg_off)); break;
    default: fprintf(f, "%d", *CFIELD(int, a, c->agg_off));
    }
}
