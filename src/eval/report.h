/* Internals of the evaluation reports (eval_write_reports): report.c writes summary.json and
 * summary.md, report_checks.c their settings, warnings, drafter comparisons and flagged responses,
 * plots.c the SVG plots. */
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
/* Distinct drafter labels (drafters) or modes, in order of appearance, into out; their count. */
int report_distinct(const eval_summary *s, int drafters, const char **out);

/* plots.c: per_position.svg, tau_hist.svg, tau_budget.svg */
int plot_per_position(const eval_summary *s, const char *path);
int plot_tau_hist(const eval_summary *s, const char *path);
int plot_tau_budget(const eval_summary *s, const char *path);

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
