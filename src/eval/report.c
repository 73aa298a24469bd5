/* Evaluation reports: summary.json and summary.md (some of their sections from report_checks.c and
 * report_howto.c), and eval_write_reports, which writes them and the SVG plots (plots.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/eval.h"
#include "columns.h"
#include "report.h"

double report_per_pos(const eval_agg *a, int k) {
    return a->pos_drafted[k] ? (double)a->pos_accepted[k] / a->pos_drafted[k] : 0.0;
}

int report_close(FILE *f, const char *path) {
    const int bad = ferror(f);
    const int e = errno;
    if (fclose(f) != 0 || bad) return dfl_seterr("%s: write error: %s", path, strerror(bad ? e : errno));
    return DFL_OK;
}

int report_has_trees(const eval_summary *s) {
    for (int k = 1; k < s->n_agg; k++)
        if (strncmp(s->agg[k].mode, "ddtree-", 7) == 0) return 1;
    return 0;
}

int report_max_proposed(const eval_summary *s) {
    int m = 0;
    for (int k = 1; k < s->n_agg; k++)
        for (int p = 1; p < s->agg[k].max_block; p++)
            if (s->agg[k].pos_drafted[p] && p > m) m = p;
    return m;
}

/* {"responses": n, "p10": .., "p50": .., "p90": ..} of per-response speedups; null under 2 responses */
static void json_spread(FILE *f, const double *v, int n) {
    double q[3];
    if (eval_spread(v, n, q)) fprintf(f, "null");
    else fprintf(f, "{\"responses\": %d, \"p10\": %.4f, \"p50\": %.4f, \"p90\": %.4f}", n, q[0], q[1], q[2]);
}

int report_run_range(const eval_agg *a, double q[3]) {
    const int n = a->n_run_speedups;
    if (n < 2) return 0;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return 0;
    for (int i = 0; i < n; i++) c[i] = a->run_speedups[i];
    int ok = 1;
    for (int i = 0; i < n; i++) { /* insertion sort: a handful of runs */
        ok &= c[i] > 0;
        for (int j = i; j > 0 && c[j - 1] > c[j]; j--) {
            const double t = c[j];
            c[j] = c[j - 1], c[j - 1] = t;
        }
    }
    q[0] = c[0], q[2] = c[n - 1], q[1] = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return ok;
}

int report_repeated_runs(const eval_summary *s) {
    int n = 0;
    for (int k = 1; k < s->n_agg; k++)
        if (s->agg[k].n_run_speedups > n) n = s->agg[k].n_run_speedups;
    return n;
}

/* Where a summary.json row shows a column (col_stat): 0 after "responses", 1 after the speedups, 2
 * after those (before the row's checks); -1 nowhere. */
static int place_of(col_stat stat) {
    return stat == STAT_TOTAL ? 0 : stat == STAT_SHARE || stat == STAT_PER_ROUND ? 1 : stat == STAT_COUNT ? 2 : -1;
}

/* The members of a summary.json row that columns give at place (place_of). */
static void column_members(FILE *f, const eval_agg *a, int place) {
    double busy = 0; /* what the shares are of */
    for (int i = 0; i < eval_n_columns; i++)
        if (eval_columns[i].stat == STAT_SHARE) busy += eval_column_agg(&eval_columns[i], a);
    for (int i = 0; i < eval_n_columns; i++) {
        const eval_column *c = &eval_columns[i];
        if (place_of(c->stat) != place) continue;
        fprintf(f, ", \"%s\": ", c->stat_key);
        const double v = eval_column_agg(c, a);
        if (c->stat == STAT_SHARE) fprintf(f, "%.4f", busy > 0 ? v / busy : 0);
        else if (c->stat == STAT_PER_ROUND) fprintf(f, "%.4f", a->rounds ? v / a->rounds : 0.0);
        else eval_column_agg_write(f, c, a);
    }
}

static int write_json(const eval_summary *s, const char *path, const char *extra) {
    FILE *f = fopen(path, "w");
    if (!f) return dfl_seterr("%s: cannot create", path);
    const eval_agg *ar = &s->agg[0];
    fprintf(f,
            "{\n  \"definitions\": {\n"
            "    \"tau\": \"mean over responses of per-response tau = (generated tokens - 1) / rounds: tokens "
            "committed per verification round, bonus included (z-lab's dataset tau)\",\n"
            "    \"tau_token_weighted\": \"sum over responses of (generated tokens - 1) / sum of rounds\",\n"
            "    \"tau_accept\": \"1 + accepted drafts / rounds (vLLM's mean acceptance length)\",\n"
            "    \"per_position\": \"for draft position k: rounds in which draft k was accepted / rounds in "
            "which it was proposed. Chain: every round proposes k, a marginal rate; DDTree: rounds whose tree reached "
            "depth k, a rate conditional on reaching it (the two do not compare)\",\n"
            "    \"speedup\": \"autoregressive decode time per token / speculative decode time per token, same "
            "engine and responses (the first token of each response comes from the prefill and is excluded); "
            "measured, online rows only\",\n"
            "    \"speedup_modeled\": \"the same from modeled times: the drafter's work at the rates measured in "
            "this run plus, per round, the target's verification cost for that many tokens (or that tree budget) "
            "measured in this run; the autoregressive side is one measured decode step per token. A model, not a "
            "measurement\",\n"
            "    \"speedup_spread\": \"10th, 50th and 90th percentile over responses of the per-response measured "
            "speedup (AR decode time per token of that prompt and turn / this row's decode time per token); null "
            "under 2 responses. speedup_modeled_spread: the same of modeled speedups\",\n"
            "    \"speedup_runs\": \"with --repeat N (online): each repetition's measured speedup over all its "
            "responses (values, index = repetition) with their min, median and max; null for a single run. tau and "
            "every other figure come from the first run\",\n"
            "    \"method\": \"online: the speculative loop ran on the target; replay: the drafter alone on the "
            "recorded target truth and features (exact at temperature 0: same rounds as online)\",\n"
            "    \"speedup_device\": \"speedups are this device's: CPU speedups do not predict GPU serving, where a "
            "verification of 16 tokens costs about one decode step (memory-bound) and the drafter's share differs\",\n"
            "    \"speedup_modeled_reliable\": \"false when the costs the modeled speedups come from fail a check "
            "(a verification or tree cheaper than a decode step, timed repetitions spread more than 2x, the decode "
            "cost far from the run's measured autoregressive step): speedup_modeled_warning says which; null when not "
            "checked\",\n"
            "    \"comparisons\": \"every drafter against the first drafter of the same mode, method and features, "
            "paired over the prompts both have: per prompt the mean over its turns of per-response tau; diff = mean "
            "of B - A, ci95 = 2.5th and 97.5th percentiles of the mean over 2000 bootstrap resamples of the prompts "
            "(Python's random.Random(1).randrange, numpy's percentile)\",\n"
            "    \"responses_at_max_new\": \"responses whose tokens reached --max-new (cut short, not ended by eos); "
            "tau_at_max_new / tau_not_at_max_new: mean per-response tau of those and of the rest\",\n"
            "    \"responses_looping\": \"responses that end in at least 3 copies of one span of p <= 256 tokens "
            "covering at least 32 tokens (the output ids; replay rows: the truth of their prompt and turn)\"\n"
            "  },\n");
    fprintf(f, "  \"activations\": \"%s\",\n", s->act_bf16 ? "bf16" : "f32");
    fprintf(f, "  \"device\": \"%s\",\n  ", dfl_device_name((dfl_device)s->device)); /* where the target ran */
    report_checks_json(f, s);
    fprintf(f, "\"prompts\": %d,\n", s->n_prompts);
    fprintf(f,
            "  \"autoregressive\": {\"responses\": %d, \"tokens\": %d, \"decode_s\": %.6f, "
            "\"prefill_s\": %.6f, \"tokens_per_s\": %.3f},\n  \"results\": [",
            ar->responses, ar->tokens, ar->time_s, ar->prefill_s,
            ar->time_s > 0 ? (ar->tokens - ar->responses) / ar->time_s : 0.0);
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        fprintf(f, "%s\n    {\"drafter\": ", k > 1 ? "," : "");
        dfl_json_write_string(f, a->drafter);
        char sp[32] = "null", spm[32] = "null", tps[32] = "null";
        if (eval_agg_speedup(a) > 0) snprintf(sp, sizeof sp, "%.4f", eval_agg_speedup(a));
        if (eval_agg_speedup_modeled(a) > 0) snprintf(spm, sizeof spm, "%.4f", eval_agg_speedup_modeled(a));
        if (a->time_s > 0) snprintf(tps, sizeof tps, "%.3f", (a->tokens - a->responses) / a->time_s);
        fprintf(f, ", \"label\": ");
        dfl_json_write_string(f, a->label);
        fprintf(f, ", \"mode\": \"%s\", \"method\": \"%s\", \"features\": \"%s\", \"responses\": %d", a->mode,
                a->method, a->features, a->responses);
        column_members(f, a, 0);
        fprintf(f,
                ", \"tau\": %.6f, \"tau_token_weighted\": %.6f, \"tau_accept\": %.6f, \"tokens_per_s\": %s, "
                "\"speedup\": %s, \"speedup_modeled\": %s",
                eval_agg_tau(a), eval_agg_tau_tokens(a), a->rounds ? 1.0 + (double)a->accepted / a->rounds : 0.0, tps,
                sp, spm);
        column_members(f, a, 1);
        column_members(f, a, 2);
        report_row_checks_json(f, a);
        fprintf(f, ", \"per_position\": [");
        for (int p = 1; p < a->max_block; p++) {
            if (a->pos_drafted[p]) fprintf(f, "%s%.6f", p > 1 ? ", " : "", report_per_pos(a, p));
            else fprintf(f, "%snull", p > 1 ? ", " : ""); /* never proposed */
        }
        fprintf(f, "], \"accept_hist\": [");
        for (int b = 0; b < a->max_block; b++) fprintf(f, "%s%ld", b ? ", " : "", a->accept_hist[b]);
        fprintf(f, "], \"speedup_spread\": ");
        json_spread(f, a->speedups, a->n_speedups);
        fprintf(f, ", \"speedup_modeled_spread\": ");
        json_spread(f, a->speedups_modeled, a->n_speedups_modeled);
        fprintf(f, ", \"speedup_runs\": ");
        double r3[3];
        if (report_run_range(a, r3)) {
            fprintf(f, "{\"runs\": %d, \"min\": %.4f, \"median\": %.4f, \"max\": %.4f, \"values\": [",
                    a->n_run_speedups, r3[0], r3[1], r3[2]);
            for (int i = 0; i < a->n_run_speedups; i++) fprintf(f, "%s%.4f", i ? ", " : "", a->run_speedups[i]);
            fprintf(f, "]}");
        } else fprintf(f, "null");
        fprintf(f, "}");
    }
    fprintf(f, "\n  ]%s%s\n}\n", extra && *extra ? ",\n  " : "", extra ? extra : "");
    return report_close(f, path);
}

int report_distinct(const eval_summary *s, int drafters, const char **out) {
    int n = 0;
    for (int k = 1; k < s->n_agg; k++) {
        const char *v = drafters ? s->agg[k].label : s->agg[k].mode;
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = strcmp(out[i], v) == 0;
        if (!seen) out[n++] = v;
    }
    return n;
}

const eval_agg *report_find(const eval_summary *s, const char *label, const char *mode) {
    for (int k = 1; k < s->n_agg; k++)
        if (strcmp(s->agg[k].label, label) == 0 && strcmp(s->agg[k].mode, mode) == 0) return &s->agg[k];
    return NULL;
}

/* " (p10–p90)" of per-response speedups after a table cell's aggregate; nothing under 2 responses. */
static void md_spread(FILE *f, const double *v, int n) {
    double q[3];
    if (eval_spread(v, n, q) == 0) fprintf(f, " (%.2f–%.2f)", q[0], q[2]);
}

/* The drafters (rows) and modes (columns) of summary.md's tables of one figure per row. */
typedef struct md_grid {
    const eval_summary *s;
    const char **dr, **md;
    int nd, nm;
} md_grid;

enum { FIG_TAU, FIG_TAU_TOKENS, FIG_SPEEDUP, FIG_MODELED, FIG_TPS, FIG_RUNS, FIG_N };

/* A figure's cell; "–" where the row has none. */
static void figure_cell(FILE *f, const eval_agg *a, int fig) {
    double q[3];
    if (fig == FIG_TAU) fprintf(f, " %.3f |", eval_agg_tau(a));
    else if (fig == FIG_TAU_TOKENS) fprintf(f, " %.3f |", eval_agg_tau_tokens(a));
    else if (fig == FIG_SPEEDUP && eval_agg_speedup(a) > 0) {
        fprintf(f, " %.2fx", eval_agg_speedup(a));
        md_spread(f, a->speedups, a->n_speedups);
        fprintf(f, " |");
    } else if (fig == FIG_MODELED && eval_agg_speedup_modeled(a) > 0) {
        fprintf(f, " %.2fx", eval_agg_speedup_modeled(a));
        md_spread(f, a->speedups_modeled, a->n_speedups_modeled);
        fprintf(f, " |");
    } else if (fig == FIG_TPS && a->time_s > 0) fprintf(f, " %.1f |", (a->tokens - a->responses) / a->time_s);
    else if (fig == FIG_RUNS && report_run_range(a, q)) fprintf(f, " %.2fx (%.2f–%.2f) |", q[1], q[0], q[2]);
    else fprintf(f, " – |");
}

/* A table of figure fig per drafter and mode or, with c, of column c's aggregate. */
static void md_table(FILE *f, const md_grid *g, const char *title, const char *note, int fig, const eval_column *c) {
    fprintf(f, "## %s%s\n\n| drafter |", title, note);
    for (int j = 0; j < g->nm; j++) fprintf(f, " %s |", g->md[j]);
    fprintf(f, "\n|---|");
    for (int j = 0; j < g->nm; j++) fprintf(f, "---:|");
    fprintf(f, "\n");
    for (int i = 0; i < g->nd; i++) {
        fprintf(f, "| %s |", g->dr[i]);
        for (int j = 0; j < g->nm; j++) {
            const eval_agg *a = report_find(g->s, g->dr[i], g->md[j]);
            if (!a) fprintf(f, " – |");
            else if (!c) figure_cell(f, a, fig);
            else {
                fputc(' ', f);
                eval_column_agg_write(f, c, a);
                fprintf(f, " |");
            }
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\n");
}

/* The tables of one figure per drafter and mode: the figures, then the columns' (md_title). */
static void md_tables(FILE *f, const md_grid *g, int any_measured, int any_modeled) {
    static const char *const titles[FIG_N] = {
        "τ (mean over responses of (tokens − 1) / rounds)",
        "τ token-weighted (Σ(tokens − 1) / Σ rounds)",
        "speedup, measured (AR time per token / speculative time per token; in parentheses p10–p90 over responses)",
        "speedup, modeled (drafter work + per-round verification costs measured in this run; in parentheses p10–p90 "
        "over responses)",
        "tokens/s",
        "speedup over repeated runs (--repeat; median, in parentheses min–max over the runs)"};
    const int runs = report_repeated_runs(g->s);
    /* the runs' range right after the measured speedups */
    static const int order[FIG_N] = {FIG_TAU, FIG_TAU_TOKENS, FIG_SPEEDUP, FIG_RUNS, FIG_MODELED, FIG_TPS};
    for (int i = 0; i < FIG_N; i++) {
        const int t = order[i];
        if (((t == FIG_SPEEDUP || t == FIG_TPS) && !any_measured) || (t == FIG_MODELED && !any_modeled) ||
            (t == FIG_RUNS && !runs))
            continue;
        md_table(f, g, titles[t],
                 t == FIG_SPEEDUP && runs ? " — the first of the repeated runs"
                 : t == FIG_MODELED && g->s->modeled_warning
                     ? " — UNRELIABLE: the costs fail their checks (Warnings, above)"
                     : "",
                 t, NULL);
    }
    for (int i = 0; i < eval_n_columns; i++)
        if (eval_columns[i].md_title) md_table(f, g, eval_columns[i].md_title, "", 0, &eval_columns[i]);
}

/* τ of each pipeline-features row (--features-from) against the same drafter on dfl's features. */
static void md_pipeline(FILE *f, const eval_summary *s) {
    fprintf(f, "## τ on dfl's features vs the pipeline's (--features-from), same truth\n\n"
               "| drafter | mode | τ dfl features | τ pipeline features | Δ |\n|---|---|---:|---:|---:|\n");
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *p = &s->agg[k];
        if (strcmp(p->features, "pipeline") != 0) continue;
        const eval_agg *d = NULL;
        for (int j = 1; j < s->n_agg && !d; j++)
            if (strcmp(s->agg[j].drafter, p->drafter) == 0 && strcmp(s->agg[j].mode, p->mode) == 0 &&
                strcmp(s->agg[j].method, p->method) == 0 && strcmp(s->agg[j].features, "dfl") == 0)
                d = &s->agg[j];
        if (!d) continue;
        fprintf(f, "| %s | %s | %.3f | %.3f | %+.3f |\n", p->drafter, p->mode, eval_agg_tau(d), eval_agg_tau(p),
                eval_agg_tau(p) - eval_agg_tau(d));
    }
    fprintf(f, "\n");
}

/* Per-position acceptance: columns up to the deepest position any row proposed; a position a
 * mode never proposed is "–" (DDTree-8 never drafts deeper than 8), not a rate of 0. */
static void md_per_position(FILE *f, const eval_summary *s) {
    const int maxb = report_max_proposed(s) + 1;
    fprintf(f, "## Per-position acceptance (rounds in which draft k was accepted / proposed; – = never "
               "proposed)\n\nChain rows: every round proposes k, a marginal rate. DDTree rows: rounds whose tree "
               "reached depth k, a rate conditional on reaching it — the two do not compare position by position.\n\n"
               "| drafter | mode |");
    for (int p = 1; p < maxb; p++) fprintf(f, " %d |", p);
    fprintf(f, "\n|---|---|");
    for (int p = 1; p < maxb; p++) fprintf(f, "---:|");
    fprintf(f, "\n");
    for (int k = 1; k < s->n_agg; k++) {
        fprintf(f, "| %s | %s |", s->agg[k].label, s->agg[k].mode);
        for (int p = 1; p < maxb; p++)
            if (p < s->agg[k].max_block && s->agg[k].pos_drafted[p])
                fprintf(f, " %.3f |", report_per_pos(&s->agg[k], p));
            else fprintf(f, " – |");
        fprintf(f, "\n");
    }
}

/* The title line and the notes on activations and device. */
static void md_head(FILE *f, const eval_summary *s, int any_replay) {
    const eval_agg *ar = &s->agg[0];
    fprintf(f, "# dfl eval summary\n\n%d prompts", s->n_prompts);
    if (ar->responses)
        fprintf(f, "; autoregressive baseline: %d tokens, %.1f tokens/s", ar->tokens,
                ar->time_s > 0 ? (ar->tokens - ar->responses) / ar->time_s : 0.0);
    fprintf(f, ".%s\n\n",
            any_replay ? " Rows are replays (drafter-only on the recorded target truth; docs/eval.md) "
                         "unless marked (online)."
                       : "");
    if (s->act_bf16)
        fprintf(f, "**Computed with bf16 activations** (DFL_ACT=bf16): every BF16 matrix product rounded its "
                   "activations to bf16, so the target is not the float32 computation of training; τ can differ "
                   "from a float32 run (compare with `dfl eval-compare`).\n\n");
    if (s->device)
        fprintf(f,
                "**Target on %s** (`--device %s`): the target's forwards ran there, the drafters on the CPU; "
                "times and speedups are this device's.\n\n",
                dfl_device_name((dfl_device)s->device), dfl_device_name((dfl_device)s->device));
}

static int write_md(const eval_summary *s, const char *path, const char *extra) {
    FILE *f = fopen(path, "w");
    if (!f) return dfl_seterr("%s: cannot create", path);
    md_grid g = {
        .s = s, .dr = calloc((size_t)s->n_agg + 1, sizeof *g.dr), .md = calloc((size_t)s->n_agg + 1, sizeof *g.md)};
    g.nd = report_distinct(s, 1, g.dr), g.nm = report_distinct(s, 0, g.md);
    int any_measured = 0, any_modeled = 0, any_replay = 0, any_pipe = 0;
    for (int k = 1; k < s->n_agg; k++) {
        any_measured |= eval_agg_speedup(&s->agg[k]) > 0;
        any_modeled |= eval_agg_speedup_modeled(&s->agg[k]) > 0;
        any_replay |= strcmp(s->agg[k].method, "replay") == 0;
        any_pipe |= strcmp(s->agg[k].features, "pipeline") == 0;
    }
    md_head(f, s, any_replay);
    report_settings_md(f, s);
    report_warnings_md(f, s);
    report_howto_md(f, s, g.dr, g.nd);
    md_tables(f, &g, any_measured, any_modeled);
    report_compare_md(f, s);
    report_outputs_md(f, s);
    if (any_pipe) md_pipeline(f, s);
    md_per_position(f, s);
    fprintf(f, "\nPlots: [per_position.svg](per_position.svg), [tau_hist.svg](tau_hist.svg)%s.\n",
            report_has_trees(s) ? ", [tau_budget.svg](tau_budget.svg)" : "");
    if (extra) fputs(extra, f);
    free(g.dr);
    free(g.md);
    return report_close(f, path);
}

int eval_write_reports(const eval_summary *s, const char *dir, const char *extra_json, const char *extra_md) {
    const char *names[] = {"summary.json", "summary.md", "per_position.svg", "tau_hist.svg", "tau_budget.svg"};
    int rc = DFL_OK;
    for (int i = 0; i < 5 && rc == DFL_OK; i++) {
        char *p = dfl_path_join(dir, names[i]);
        if (i == 4 && !report_has_trees(s)) { /* no tree modes: no plot, and none of an earlier run left behind */
            if (unlink(p) != 0 && errno != ENOENT) rc = dfl_seterr("%s: cannot remove: %s", p, strerror(errno));
            free(p);
            break;
        }
        /* written whole, then renamed over the old one: a kill or a full disk never leaves a torn
         * report, and the previous one stays until the new one is complete */
        const size_t n = strlen(p) + 8;
        char *tmp = malloc(n);
        if (!tmp) {
            free(p);
            return dfl_seterr("out of memory");
        }
        snprintf(tmp, n, "%s.tmp", p);
        rc = i == 0   ? write_json(s, tmp, extra_json)
             : i == 1 ? write_md(s, tmp, extra_md)
             : i == 2 ? plot_per_position(s, tmp)
             : i == 3 ? plot_tau_hist(s, tmp)
                      : plot_tau_budget(s, tmp);
        if (rc == DFL_OK && rename(tmp, p) != 0)
            rc = dfl_seterr("%s: cannot rename into place: %s", p, strerror(errno));
        if (rc != DFL_OK) unlink(tmp);
        free(tmp);
        free(p);
    }
    return rc;
}

int eval_remove_reports(const char *dir) {
    static const char *const names[] = {"summary.json", "summary.md",     "per_position.svg",
                                        "tau_hist.svg", "tau_budget.svg", "train_vs_serve.svg"};
    int rc = DFL_OK;
    for (size_t i = 0; i < sizeof names / sizeof *names && rc == DFL_OK; i++) {
        char *p = dfl_path_join(dir, names[i]);
        if (unlink(p) != 0 && errno != ENOENT) rc = dfl_seterr("%s: cannot remove: %s", p, strerror(errno));
        free(p);
    }
    return rc;
}
