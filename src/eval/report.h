/* Internals of the evaluation reports (eval_write_reports): report.c writes summary.json and
 * summary.md, report_checks.c their settings, warnings, drafter comparisons and flagged responses,
 * report_howto.c summary.md's "How to read this", plots.c the SVG plots. The rows' figures that
 * come from results.jsonl's columns are in the columns table (columns.h). */
#ifndef DFL_EVAL_REPORT_H
#define DFL_EVAL_REPORT_H

#include <stdio.h>

#include "dfl/eval.h"

/* Close a report written to path: an error of any write (not only the last flush) fails it. */
int report_close(FILE *f, const char *path);
/* Rounds in which draft k was accepted / proposed (0 when never proposed). */
double report_per_pos(const eval_agg *a, int k);
/* Some row is a DDTree mode. */
int report_has_trees(const eval_summary *s);
/* The deepest draft position any row proposed (0 if none). */
int report_max_proposed(const eval_summary *s);
/* The row of this drafter label and mode, NULL if none. */
const eval_agg *report_find(const eval_summary *s, const char *label, const char *mode);
/* Min, median and max of a row's speedups over repeated runs (--repeat) into q; 0 when the run
 * was not repeated (or a repetition has no speedup). */
int report_run_range(const eval_agg *a, double q[3]);
/* The repeated runs of this summary (--repeat), 0 when none. */
int report_repeated_runs(const eval_summary *s);
/* Distinct drafter labels (drafters) or modes, in order of appearance, into out; their count. */
int report_distinct(const eval_summary *s, int drafters, const char **out);

/* plots.c: per_position.svg, tau_hist.svg, tau_budget.svg */
int plot_per_position(const eval_summary *s, const char *path);
int plot_tau_hist(const eval_summary *s, const char *path);
int plot_tau_budget(const eval_summary *s, const char *path);

/* report_howto.c: summary.md's "How to read this" (dr: the drafter labels, report_distinct) */
void report_howto_md(FILE *f, const eval_summary *s, const char **dr, int nd);

/* report_checks.c */
/* The row accepts (nearly) nothing: τ at most EVAL_TAU_DEAD. */
int report_dead(const eval_agg *a);
/* summary.md's "Settings" section (from s->run), then "Warnings" when there are any. */
void report_settings_md(FILE *f, const eval_summary *s);
void report_warnings_md(FILE *f, const eval_summary *s);
/* summary.md's sections "Drafters compared" and "Responses that reached --max-new or loop". */
void report_compare_md(FILE *f, const eval_summary *s);
void report_outputs_md(FILE *f, const eval_summary *s);
/* summary.json: the checks' top-level members (each followed by ",\n  ") and a row's members
 * (each after ", "). */
void report_checks_json(FILE *f, const eval_summary *s);
void report_row_checks_json(FILE *f, const eval_agg *a);

#endif
