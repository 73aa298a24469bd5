/* The scalar columns of results.jsonl (docs/eval.md), one row of eval_columns (columns.c) each:
 * the row says how its column is written (eval_result_write), read back (eval_result_parse),
 * summed into eval_agg (eval_summarize) and shown in summary.json and summary.md (report.c). A new
 * column is a field of eval_result (and of eval_agg when it is aggregated) and one row.
 *
 * Not rows, because their rules are their own (results.c): the arrays accept_hist, pos_drafted and
 * pos_accepted (as long as block_size says; positions from 1), round_lengths (written only),
 * output_ids (read only on request, into an array of the caller's). eval_summarize aggregates the
 * modeled times itself (a response counts when it has both) and per-response τ (1 without rounds,
 * where the written column says 0). */
#ifndef DFL_EVAL_COLUMNS_H
#define DFL_EVAL_COLUMNS_H

#include <stddef.h>
#include <stdio.h>

#include "dfl/eval.h"

typedef enum col_type {
    COL_STR,     /* char[size]: a JSON string */
    COL_INT,     /* int, "%d": an integer in [lo, hi] */
    COL_LONG,    /* long, "%ld": an integer in [lo, hi] */
    COL_SECONDS, /* double, "%.6f": a finite number */
    COL_BOOL,    /* int: true 1, false 0, null -1 (n/a); anything but a boolean reads as null */
    COL_NAME,    /* int i, written as the string name(i), 0 <= i < n_names */
    COL_DERIVED, /* "%.6f" of derive(result): written, not read back */
} col_type;

enum {
    COL_OPTIONAL = 1,                /* may be absent (older lines): the field keeps eval_result_init's value */
    COL_NULLABLE = 2 | COL_OPTIONAL, /* null reads as absent too (its error says "must be", not "missing") */
    COL_IF_SET = 4 | COL_OPTIONAL,   /* written only when set: an int not 0, a time not negative */
};

/* How eval_summarize folds the column into the eval_agg field at agg_off. */
typedef enum col_agg {
    AGG_NONE,
    AGG_SUM,         /* a field of the column's type */
    AGG_MAX,         /* an int field */
    AGG_COUNT_FALSE, /* an int field: the responses where the column is false */
} col_agg;

/* Where and how a summary.json row shows the aggregate, as stat_key. */
typedef enum col_stat {
    STAT_NONE,
    STAT_TOTAL,     /* as summed, after "responses" */
    STAT_SHARE,     /* "%.4f" of the sum of every STAT_SHARE column, after the speedups */
    STAT_PER_ROUND, /* "%.4f" per round, after the speedups */
    STAT_COUNT,     /* as counted, after the rates (responses flagged, next to the row's checks) */
} col_stat;

typedef struct eval_column {
    const char *key; /* in results.jsonl */
    col_type type;
    int flags;     /* COL_*; none: every line has it */
    size_t off;    /* of the field in eval_result */
    size_t size;   /* COL_STR: of its buffer */
    double lo, hi; /* COL_INT, COL_LONG */
    const char *(*name)(int);
    int n_names;                            /* COL_NAME */
    double (*derive)(const eval_result *r); /* COL_DERIVED */
    col_agg agg;
    size_t agg_off; /* of the field in eval_agg */
    col_stat stat;
    const char *stat_key; /* in a summary.json row */
    const char *md_title; /* a table in summary.md of the aggregate per drafter and mode; NULL: none */
} eval_column;

/* The largest magnitude of an integer field: exact in a double, inside a long. */
#define RES_MAX_INT 9.0e15

extern const eval_column eval_columns[];
extern const int eval_n_columns;

/* The columns of r as JSON object members, the first without a separator. */
void eval_columns_write(FILE *f, const eval_result *r);
/* The columns of a results line into r (set up by eval_result_init); DFL_ERR naming the column. */
int eval_columns_parse(const struct cJSON *o, eval_result *r);
/* Fold r into a (AGG_* of every column). */
void eval_columns_add(eval_agg *a, const eval_result *r);
/* x as an integer in [lo, hi] into v, checked on the double before any cast (an out-of-range cast
 * is undefined behaviour); -1 when it is not. */
int col_int_of(const struct cJSON *x, double lo, double hi, double *v);
/* The aggregate of column c in a, as a number, and as summary.json and summary.md print it. */
double eval_column_agg(const eval_column *c, const eval_agg *a);
void eval_column_agg_write(FILE *f, const eval_column *c, const eval_agg *a);

#endif
