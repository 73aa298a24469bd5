/* Evaluation reports: summary.json, summary.md and SVG plots. */
#include <errno.h>
#include <math.h>
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

/* min, median and max of a row's speedups over repeated runs (--repeat) into q; 0 when the run
 * was not repeated (or a repetition has no speedup). */
static int run_range(const eval_agg *a, double q[3]) {
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

/* The repeated runs of this summary (--repeat), 0 when none. */
static int repeated_runs(const eval_summary *s) {
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
    fprintf(f, "{\n  \"definitions\": {\n"
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
    fprintf(f, "  \"autoregressive\": {\"responses\": %d, \"tokens\": %d, \"decode_s\": %.6f, "
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
        fprintf(f, ", \"tau\": %.6f, \"tau_token_weighted\": %.6f, \"tau_accept\": %.6f, \"tokens_per_s\": %s, "
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
        if (run_range(a, r3)) {
            fprintf(f, "{\"runs\": %d, \"min\": %.4f, \"median\": %.4f, \"max\": %.4f, \"values\": [", a->n_run_speedups,
                    r3[0], r3[1], r3[2]);
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

static const eval_agg *find(const eval_summary *s, const char *drafter, const char *mode) {
    for (int k = 1; k < s->n_agg; k++)
        if (strcmp(s->agg[k].label, drafter) == 0 && strcmp(s->agg[k].mode, mode) == 0) return &s->agg[k];
    return NULL;
}

/* The budget of a DDTree mode, 0 for any other mode. */
static int tree_budget(const eval_agg *a) { return strncmp(a->mode, "ddtree-", 7) == 0 ? atoi(a->mode + 7) : 0; }

/* " (p10–p90)" of per-response speedups after a table cell's aggregate; nothing under 2 responses. */
static void md_spread(FILE *f, const double *v, int n) {
    double q[3];
    if (eval_spread(v, n, q) == 0) fprintf(f, " (%.2f–%.2f)", q[0], q[2]);
}

/* The row whose per-response speedups spread most (p90 - p10); NULL when none has 2 responses. */
static const eval_agg *widest_spread(const eval_summary *s, int modeled, double q[3]) {
    const eval_agg *w = NULL;
    double best = -1, t[3];
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        if (eval_spread(modeled ? a->speedups_modeled : a->speedups, modeled ? a->n_speedups_modeled : a->n_speedups,
                        t) == 0 && t[2] - t[0] > best) {
            best = t[2] - t[0], w = a;
            memcpy(q, t, sizeof t);
        }
    }
    return w;
}

/* "How to read this": what a drafter author should conclude, in this run's own numbers. */
static void write_howto(FILE *f, const eval_summary *s, const char **dr, int nd) {
    if (s->n_agg < 2) return; /* no drafter rows */
    fprintf(f, "## How to read this\n\n");
    /* 1. the two tau definitions: which is larger here, by how much, and why */
    int rows = 0, n_mean = 0, n_tw = 0;
    const eval_agg *gap = NULL;
    double gmax = -1;
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        if (!a->rounds) continue;
        const double d = eval_agg_tau(a) - eval_agg_tau_tokens(a);
        rows++;
        n_mean += d > 0.0005;
        n_tw += d < -0.0005;
        if (fabs(d) > gmax) gmax = fabs(d), gap = a;
    }
    if (rows) {
        fprintf(f, "- **Which τ to quote.** τ (mean over responses of per-response (tokens − 1) / rounds) is z-lab's "
                   "dataset τ, the number model cards quote; token-weighted τ (Σ(tokens − 1) / Σ rounds) is what "
                   "throughput follows. ");
        if (n_mean == rows) fprintf(f, "Here τ is larger than token-weighted τ in every row");
        else if (n_tw == rows) fprintf(f, "Here token-weighted τ is larger than τ in every row");
        else if (!n_mean && !n_tw) fprintf(f, "Here the two agree in every row (to 0.001)");
        else fprintf(f, "Here τ is larger in %d of %d rows, token-weighted τ in %d", n_mean, rows, n_tw);
        if (n_mean || n_tw) {
            const double t = eval_agg_tau(gap), w = eval_agg_tau_tokens(gap);
            fprintf(f, "; the largest gap: %s %s, τ %.3f vs token-weighted %.3f (%+.3f, %+.1f%%)", gap->label,
                    gap->mode, t, w, t - w, w > 0 ? 100.0 * (t - w) / w : 0.0);
        }
        if (n_mean >= n_tw && n_mean)
            fprintf(f, ". The mean gives every response the same weight whatever its length, so short responses "
                       "(few rounds) with a high τ weigh more in it than in the token-weighted τ, which counts each response by "
                       "its rounds");
        else if (n_tw)
            fprintf(f, ". The token-weighted τ counts each response by its rounds, so long responses with a high τ "
                       "weigh more in it than in the mean, where a short response with a low τ counts as much as a "
                       "long one");
        const eval_agg *v = gap ? gap : &s->agg[1];
        fprintf(f, ". vLLM's 1 + accepted / rounds (`tau_accept` in summary.json) is %.3f for %s %s: the "
                   "token-weighted τ but for rounds cut short by eos or --max-new.\n",
                v->rounds ? 1.0 + (double)v->accepted / v->rounds : 0.0, v->label, v->mode);
    }
    /* 2. a DDTree budget below the block's drafts that trails the chain */
    int first = 1;
    for (int i = 0; i < nd; i++) {
        const eval_agg *chain = find(s, dr[i], "chain");
        if (!chain) continue;
        const int drafts = chain->max_block - 1;
        for (int k = 1; k < s->n_agg; k++) {
            const eval_agg *a = &s->agg[k];
            const int n = tree_budget(a);
            if (strcmp(a->label, dr[i]) != 0 || n <= 0 || n >= drafts || eval_agg_tau(a) >= eval_agg_tau(chain) - 0.0005)
                continue;
            if (first)
                fprintf(f, "- **A DDTree budget below the block trails the chain.** DDTree-N caps the tree at N "
                           "nodes, so a round can never accept more than N drafts (τ ≤ N + 1), while a chain of "
                           "block %d proposes %d: at high acceptance the small tree loses. Here:",
                        chain->max_block, drafts);
            fprintf(f, "%s %s %s τ %.3f (at most %d) vs chain %.3f", first ? "" : ";", a->label, a->mode,
                    eval_agg_tau(a), n + 1, eval_agg_tau(chain));
            first = 0;
        }
    }
    if (!first) fprintf(f, ".\n");
    /* 3. the best mode of each drafter, by tau and by speedup */
    first = 1;
    for (int i = 0; i < nd; i++) {
        const eval_agg *bt = NULL, *bm = NULL, *bs = NULL;
        int modes = 0;
        for (int k = 1; k < s->n_agg; k++) {
            const eval_agg *a = &s->agg[k];
            if (strcmp(a->label, dr[i]) != 0) continue;
            modes++;
            if (!bt || eval_agg_tau(a) > eval_agg_tau(bt)) bt = a;
            if (eval_agg_speedup(a) > 0 && (!bs || eval_agg_speedup(a) > eval_agg_speedup(bs))) bs = a;
            if (eval_agg_speedup_modeled(a) > 0 && (!bm || eval_agg_speedup_modeled(a) > eval_agg_speedup_modeled(bm)))
                bm = a;
        }
        if (modes < 2) continue;
        fprintf(f, "%s%s: by τ %s", first ? "- **Best mode.** " : "; ", dr[i], bt->mode);
        for (int k = 1; k < s->n_agg; k++) /* modes tied with the best (to the 3 decimals shown) */
            if (&s->agg[k] != bt && strcmp(s->agg[k].label, dr[i]) == 0 &&
                fabs(eval_agg_tau(&s->agg[k]) - eval_agg_tau(bt)) < 0.0005)
                fprintf(f, " = %s", s->agg[k].mode);
        fprintf(f, " (%.3f)", eval_agg_tau(bt));
        if (bs) fprintf(f, ", by measured speedup %s (%.2fx)", bs->mode, eval_agg_speedup(bs));
        if (bm)
            fprintf(f, ", by modeled speedup %s (%.2fx%s)", bm->mode, eval_agg_speedup_modeled(bm),
                    s->modeled_warning ? ", unreliable" : "");
        first = 0;
    }
    if (!first)
        fprintf(f, ". More τ is not more speed when a round costs more (a bigger tree to verify, a deeper draft).\n");
    /* 4. speedups and their spread over responses */
    int any_measured = 0, any_modeled = 0;
    for (int k = 1; k < s->n_agg; k++) {
        any_measured |= eval_agg_speedup(&s->agg[k]) > 0;
        any_modeled |= eval_agg_speedup_modeled(&s->agg[k]) > 0;
    }
    double q[3];
    const eval_agg *w;
    if (any_measured) {
        fprintf(f, "- **Measured speedups** (online rows) are ratios of wall-clock times: on a loaded machine they "
                   "move between repeated runs%s. ",
                any_modeled ? "" : " (a replay's modeled speedups do not move with load this way)");
        if ((w = widest_spread(s, 0, q)))
            fprintf(f, "Per response (AR time per token of the same prompt / this time per token) they spread "
                       "here from %.2fx (p10) to %.2fx (p90), median %.2fx, for %s %s, the widest; each row's "
                       "p10–p90 is in parentheses in the speedup table (`speedup_spread` in summary.json).\n",
                    q[0], q[2], q[1], w->label, w->mode);
        else fprintf(f, "One response per row here: no spread.\n");
        const int runs = repeated_runs(s);
        const eval_agg *wr = NULL;
        double rq[3], wq[3];
        for (int k = 1; k < s->n_agg; k++)
            if (run_range(&s->agg[k], rq) && (!wr || rq[2] - rq[0] > wq[2] - wq[0])) wr = &s->agg[k], memcpy(wq, rq, sizeof rq);
        if (wr)
            fprintf(f, "  Over the %d repeated runs here (`--repeat`) the speedups moved most for %s %s: %.2fx to %.2fx "
                       "(median %.2fx); every row's median and range are in the table \"speedup over repeated "
                       "runs\". A difference between two rows smaller than their ranges is not a result.\n",
                    runs, wr->label, wr->mode, wq[0], wq[2], wq[1]);
        else
            fprintf(f, "  This was one run: `--repeat N` runs every prompt N times and gives each speedup's range "
                       "over runs.\n");
    }
    if ((any_measured || any_modeled) && s->device == 0)
        fprintf(f, "- **These are CPU speedups; they do not predict GPU serving.** On a GPU a verification of 16 "
                   "tokens costs about one decode step (memory-bound: 1.30x on an H200, docs/backends.md) and the "
                   "drafter's share of a round differs, so a drafter slower than autoregressive decoding here can be "
                   "faster there; measure there (`--device cuda`). τ does not depend on the device.\n");
    if (any_modeled) {
        fprintf(f, "- **Modeled speedups** (replay) price each verification, and the autoregressive side, with "
                   "target costs measured once at the start of the run (only the drafter's work is timed as it "
                   "goes), so load during the run does not move them the way it moves measured ones; load during "
                   "the cost measurement shifts them all together. ");
        if ((w = widest_spread(s, 1, q)))
            fprintf(f, "Their spread over responses reflects the responses, not the machine: widest %s %s, "
                       "%.2fx–%.2fx (p10–p90), median %.2fx (`speedup_modeled_spread`).\n",
                    w->label, w->mode, q[0], q[2], q[1]);
        else fprintf(f, "One response per row here: no spread.\n");
        if (s->modeled_warning)
            fprintf(f, "  **Here the costs fail their checks: the modeled speedups are unreliable** (Warnings, above).\n");
        else if (s->modeled_checked)
            fprintf(f, "  The costs passed their checks (every verification and tree at least a decode step, timed "
                       "repetitions within 2x of the fastest, the decode cost near the measured autoregressive step).\n");
    }
    fprintf(f, "\n");
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
    else if (fig == FIG_RUNS && run_range(a, q)) fprintf(f, " %.2fx (%.2f–%.2f) |", q[1], q[0], q[2]);
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
            const eval_agg *a = find(g->s, g->dr[i], g->md[j]);
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
        "τ (mean over responses of (tokens − 1) / rounds)", "τ token-weighted (Σ(tokens − 1) / Σ rounds)",
        "speedup, measured (AR time per token / speculative time per token; in parentheses p10–p90 over responses)",
        "speedup, modeled (drafter work + per-round verification costs measured in this run; in parentheses p10–p90 "
        "over responses)",
        "tokens/s", "speedup over repeated runs (--repeat; median, in parentheses min–max over the runs)"};
    const int runs = repeated_runs(g->s);
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
            if (p < s->agg[k].max_block && s->agg[k].pos_drafted[p]) fprintf(f, " %.3f |", report_per_pos(&s->agg[k], p));
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
    fprintf(f, ".%s\n\n", any_replay ? " Rows are replays (drafter-only on the recorded target truth; docs/eval.md) "
                                        "unless marked (online)." : "");
    if (s->act_bf16)
        fprintf(f, "**Computed with bf16 activations** (DFL_ACT=bf16): every BF16 matrix product rounded its "
                   "activations to bf16, so the target is not the float32 computation of training; τ can differ "
                   "from a float32 run (compare with `dfl eval-compare`).\n\n");
    if (s->device)
        fprintf(f, "**Target on %s** (`--device %s`): the target's forwards ran there, the drafters on the CPU; "
                   "times and speedups are this device's.\n\n", dfl_device_name((dfl_device)s->device),
                dfl_device_name((dfl_device)s->device));
}

static int write_md(const eval_summary *s, const char *path, const char *extra) {
    FILE *f = fopen(path, "w");
    if (!f) return dfl_seterr("%s: cannot create", path);
    md_grid g = {.s = s, .dr = calloc((size_t)s->n_agg + 1, sizeof *g.dr), .md = calloc((size_t)s->n_agg + 1, sizeof *g.md)};
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
    write_howto(f, s, g.dr, g.nd);
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
        rc = i == 0 ? write_json(s, tmp, extra_json)
             : i == 1 ? write_md(s, tmp, extra_md)
             : i == 2 ? plot_per_position(s, tmp)
             : i == 3 ? plot_tau_hist(s, tmp)
                      : plot_tau_budget(s, tmp);
        if (rc == DFL_OK && rename(tmp, p) != 0) rc = dfl_seterr("%s: cannot rename into place: %s", p, strerror(errno));
        if (rc != DFL_OK) unlink(tmp);
        free(tmp);
        free(p);
    }
    return rc;
}

int eval_remove_reports(const char *dir) {
    static const char *const names[] = {"summary.json", "summary.md", "per_position.svg", "tau_hist.svg",
                                        "tau_budget.svg", "train_vs_serve.svg"};
    int rc = DFL_OK;
    for (size_t i = 0; i < sizeof names / sizeof *names && rc == DFL_OK; i++) {
        char *p = dfl_path_join(dir, names[i]);
        if (unlink(p) != 0 && errno != ENOENT) rc = dfl_seterr("%s: cannot remove: %s", p, strerror(errno));
        free(p);
    }
    return rc;
}
