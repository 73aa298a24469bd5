/* Drafter evaluation (SPEC §7): prompt sets, per-response results, aggregates, reports. */
#ifndef DFL_EVAL_H
#define DFL_EVAL_H

#include <stdint.h>
#include <stdio.h>

#include "dfl/spec.h"

/* ---- prompt sets ----------------------------------------------------------------------- */

typedef enum eval_format {
    EVAL_FMT_GSM8K,   /* JSON lines with "question" */
    EVAL_FMT_MTBENCH, /* JSON lines with "question_id" and "turns" (1 or 2 user turns) */
    EVAL_FMT_JSONL,   /* JSON lines, the prompt in a named string field */
    EVAL_FMT_TEXT,    /* one prompt per line */
} eval_format;

typedef struct eval_prompt {
    char *id;       /* "idx" / "id" / "question_id" field, or the 1-based line number */
    char *turns[2]; /* user turns (MT-Bench may have two) */
    int n_turns;
    int line;       /* line in the file */
} eval_prompt;

typedef struct eval_prompts {
    eval_prompt *p;
    int n;
    int *bad_lines; /* lines skipped with keep_going */
    int n_bad;
} eval_prompts;

/* Parse "gsm8k", "mtbench", "text" or "jsonl:FIELD". */
int eval_format_parse(const char *s, eval_format *fmt, char *field, int field_len);
/* Load a prompt file. A malformed line is an error naming file and line, unless keep_going
 * (then it is recorded in bad_lines). limit > 0 keeps the first `limit` prompts. */
int eval_prompts_load(eval_prompts *ps, const char *path, eval_format fmt, const char *field, int limit,
                      int keep_going);
void eval_prompts_free(eval_prompts *ps);

/* ---- results and aggregates ------------------------------------------------------------- */

/* One response: the autoregressive run (mode "ar") or a drafter in a verification mode. */
typedef struct eval_result {
    char prompt_id[128];
    char drafter[512];   /* "" for the autoregressive run */
    char mode[32];       /* "ar", "chain" or "ddtree-N" */
    int turn;            /* 0 or 1 (MT-Bench second turn) */
    int tokens;          /* generated tokens */
    int rounds;
    long drafted, accepted;
    int max_block;
    long accept_hist[DFL_MAX_BLOCK + 1];
    long pos_drafted[DFL_MAX_BLOCK], pos_accepted[DFL_MAX_BLOCK];
    long tree_depth_sum;
    double time_s;       /* decode time (prefill excluded) */
    double prefill_s, draft_s, verify_s, rollback_s;
    int match;           /* speculative output equals the autoregressive one (1), differs (0), n/a (-1) */
    int first_mismatch;  /* position of the first differing token, -1 */
} eval_result;

/* Fill from generation stats. */
void eval_result_from_stats(eval_result *r, const dfl_gen_stats *st);
/* One JSON object (no newline); ids: the generated tokens (may be NULL). */
void eval_result_write(FILE *f, const eval_result *r, const int32_t *ids, int n_ids);
/* Parse one results.jsonl line; ids (optional) receives malloc'd token ids. */
int eval_result_parse(const char *line, eval_result *r, int32_t **ids, int *n_ids);

/* Aggregate of all responses of one drafter x mode (or of the autoregressive runs). */
typedef struct eval_agg {
    char drafter[512], mode[32];
    int responses, tokens, rounds, mismatches, max_block;
    long drafted, accepted;
    double tau_sum;      /* sum over responses of per-response tau */
    double time_s, ar_time_s;
    int ar_tokens;
    double draft_s, verify_s, rollback_s, prefill_s;
    long tree_depth_sum;
    long accept_hist[DFL_MAX_BLOCK + 1];
    long pos_drafted[DFL_MAX_BLOCK], pos_accepted[DFL_MAX_BLOCK];
    double *taus;        /* per-response tau, for the histogram */
} eval_agg;

typedef struct eval_summary {
    eval_agg *agg;       /* agg[0] is the autoregressive baseline */
    int n_agg;
    int n_prompts;       /* responses of the autoregressive run */
} eval_summary;

/* Build the summary from results (each response once; later duplicates are ignored). */
int eval_summarize(eval_summary *s, const eval_result *results, int n);
void eval_summary_free(eval_summary *s);
/* Derived figures of one aggregate. */
double eval_agg_tau(const eval_agg *a);        /* mean of per-response tau (z-lab's dataset tau) */
double eval_agg_tau_tokens(const eval_agg *a); /* token-weighted: (tokens - responses) / rounds */
double eval_agg_speedup(const eval_agg *a);    /* AR time per token / this time per token */

/* Reports into dir: summary.json (extra: a JSON object's members to merge in, or NULL),
 * summary.md, per_position.svg, tau_hist.svg. */
int eval_write_reports(const eval_summary *s, const char *dir, const char *extra_json);

#endif
