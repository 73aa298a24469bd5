/* summary.md's "How to read this": what a drafter author should conclude, in this run's own
 * numbers: which τ to quote, DDTree budgets that trail the chain, each drafter's best mode, how far
 * the speedups can be trusted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

/* The budget of a DDTree mode, 0 for any other mode. */
static int tree_budget(const eval_agg *a) { return strncmp(a->mode, "ddtree-", 7) == 0 ? atoi(a->mode + 7) : 0; }

/* The row whose per-response speedups spread most (p90 - p10); NULL when none has 2 responses. */
static const eval_agg *widest_spread(const eval_summary *s, int modeled, double q[3]) {
    const eval_agg *w = NULL;
    double best = -1, t[3];
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        if (eval_spread(modeled ? a->speedups_modeled : a->speedups, modeled ? a->n_speedups_modeled : a->n_speedups,
                        t) == 0 &&
            t[2] - t[0] > best) {
            best = t[2] - t[0], w = a;
            memcpy(q, t, sizeof t);
        }
    }
    return w;
}

/* The two τ definitions: which is larger here, by how much, and why. */
static void howto_tau(FILE *f, const eval_summary *s) {
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
    if (!rows) return;
    fprintf(f, "- **Which τ to quote.** τ (mean over responses of per-response (tokens − 1) / rounds) is z-lab's "
               "dataset τ, the number model cards quote; token-weighted τ (Σ(tokens − 1) / Σ rounds) is what "
               "throughput follows. ");
    if (n_mean == rows) fprintf(f, "Here τ is larger than token-weighted τ in every row");
    else if (n_tw == rows) fprintf(f, "Here token-weighted τ is larger than τ in every row");
    else if (!n_mean && !n_tw) fprintf(f, "Here the two agree in every row (to 0.001)");
    else fprintf(f, "Here τ is larger in %d of %d rows, token-weighted τ in %d", n_mean, rows, n_tw);
    if (n_mean || n_tw) {
        const double t = eval_agg_tau(gap), w = eval_agg_tau_tokens(gap);
        fprintf(f, "; the largest gap: %s %s, τ %.3f vs token-weighted %.3f (%+.3f, %+.1f%%)", gap->label, gap->mode, t,
                w, t - w, w > 0 ? 100.0 * (t - w) / w : 0.0);
    }
    if (n_mean >= n_tw && n_mean)
        fprintf(
            f,
            ". The mean gives every response the same weight whatever its length, so short responses "
            "(few rounds) with a high τ weigh more in it than in the token-weighted τ, which counts each response by "
            "its rounds");
    else if (n_tw)
        fprintf(f, ". The token-weighted τ counts each response by its rounds, so long responses with a high τ "
                   "weigh more in it than in the mean, where a short response with a low τ counts as much as a "
                   "long one");
    const eval_agg *v = gap ? gap : &s->agg[1];
    fprintf(f,
            ". vLLM's 1 + accepted / rounds (`tau_accept` in summary.json) is %.3f for %s %s: the "
            "token-weighted τ but for rounds cut short by eos or --max-new.\n",
            v->rounds ? 1.0 + (double)v->accepted / v->rounds : 0.0, v->label, v->mode);
}

/* A DDTree budget below the block's drafts that trails the chain. */
static void howto_budgets(FILE *f, const eval_summary *s, const char **dr, int nd) {
    int first = 1;
    for (int i = 0; i < nd; i++) {
        const eval_agg *chain = report_find(s, dr[i], "chain");
        if (!chain) continue;
        const int drafts = chain->max_block - 1;
        for (int k = 1; k < s->n_agg; k++) {
            const eval_agg *a = &s->agg[k];
            const int n = tree_budget(a);
            if (strcmp(a->label, dr[i]) != 0 || n <= 0 || n >= drafts ||
                eval_agg_tau(a) >= eval_agg_tau(chain) - 0.0005)
                continue;
            if (first)
                fprintf(f,
                        "- **A DDTree budget below the block trails the chain.** DDTree-N caps the tree at N "
                        "nodes, so a round can never accept more than N drafts (τ ≤ N + 1), while a chain of "
                        "block %d proposes %d: at high acceptance the small tree loses. Here:",
                        chain->max_block, drafts);
            fprintf(f, "%s %s %s τ %.3f (at most %d) vs chain %.3f", first ? "" : ";", a->label, a->mode,
                    eval_agg_tau(a), n + 1, eval_agg_tau(chain));
            first = 0;
        }
    }
    if (!first) fprintf(f, ".\n");
}

/* The best mode of each drafter, by τ and by speedup. */
static void howto_best_mode(FILE *f, const eval_summary *s, const char **dr, int nd) {
    int first = 1;
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
}

/* Measured speedups: their spread over responses and over repeated runs. */
static void howto_measured(FILE *f, const eval_summary *s, int any_modeled) {
    double q[3];
    const eval_agg *w;
    fprintf(f,
            "- **Measured speedups** (online rows) are ratios of wall-clock times: on a loaded machine they "
            "move between repeated runs%s. ",
            any_modeled ? "" : " (a replay's modeled speedups do not move with load this way)");
    if ((w = widest_spread(s, 0, q)))
        fprintf(f,
                "Per response (AR time per token of the same prompt / this time per token) they spread "
                "here from %.2fx (p10) to %.2fx (p90), median %.2fx, for %s %s, the widest; each row's "
                "p10–p90 is in parentheses in the speedup table (`speedup_spread` in summary.json).\n",
                q[0], q[2], q[1], w->label, w->mode);
    else fprintf(f, "One response per row here: no spread.\n");
    const int runs = report_repeated_runs(s);
    const eval_agg *wr = NULL;
    double rq[3], wq[3];
    for (int k = 1; k < s->n_agg; k++)
        if (report_run_range(&s->agg[k], rq) && (!wr || rq[2] - rq[0] > wq[2] - wq[0]))
            wr = &s->agg[k], memcpy(wq, rq, sizeof rq);
    if (wr)
        fprintf(f,
                "  Over the %d repeated runs here (`--repeat`) the speedups moved most for %s %s: %.2fx to %.2fx "
                "(median %.2fx); every row's median and range are in the table \"speedup over repeated "
                "runs\". A difference between two rows smaller than their ranges is not a result.\n",
                runs, wr->label, wr->mode, wq[0], wq[2], wq[1]);
    else
        fprintf(f, "  This was one run: `--repeat N` runs every prompt N times and gives each speedup's range "
                   "over runs.\n");
}

/* Modeled speedups: what moves them and whether their costs passed the checks. */
static void howto_modeled(FILE *f, const eval_summary *s) {
    double q[3];
    const eval_agg *w;
    fprintf(f, "- **Modeled speedups** (replay) price each verification, and the autoregressive side, with "
               "target costs measured once at the start of the run (only the drafter's work is timed as it "
               "goes), so load during the run does not move them the way it moves measured ones; load during "
               "the cost measurement shifts them all together. ");
    if ((w = widest_spread(s, 1, q)))
        fprintf(f,
                "Their spread over responses reflects the responses, not the machine: widest %s %s, "
                "%.2fx–%.2fx (p10–p90), median %.2fx (`speedup_modeled_spread`).\n",
                w->label, w->mode, q[0], q[2], q[1]);
    else fprintf(f, "One response per row here: no spread.\n");
    if (s->modeled_warning)
        fprintf(f, "  **Here the costs fail their checks: the modeled speedups are unreliable** (Warnings, above).\n");
    else if (s->modeled_checked)
        fprintf(f, "  The costs passed their checks (every verification and tree at least a decode step, timed "
                   "repetitions within 2x of the fastest, the decode cost near the measured autoregressive step).\n");
}

void report_howto_md(FILE *f, const eval_summary *s, const char **dr, int nd) {
    if (s->n_agg < 2) return; /* no drafter rows */
    fprintf(f, "## How to read this\n\n");
    howto_tau(f, s);
    howto_budgets(f, s, dr, nd);
    howto_best_mode(f, s, dr, nd);
    int any_measured = 0, any_modeled = 0;
    for (int k = 1; k < s->n_agg; k++) {
        any_measured |= eval_agg_speedup(&s->agg[k]) > 0;
        any_modeled |= eval_agg_speedup_modeled(&s->agg[k]) > 0;
    }
    if (any_measured) howto_measured(f, s, any_modeled);
    if ((any_measured || any_modeled) && s->device == 0)
        fprintf(f, "- **These are CPU speedups; they do not predict GPU serving.** On a GPU a verification of 16 "
                   "tokens costs about one decode step (memory-bound: 1.30x on an H200, docs/backends.md) and the "
                   "drafter's share of a round differs, so a drafter slower than autoregressive decoding here can be "
                   "faster there; measure there (`--device cuda`). τ does not depend on the device.\n");
    if (any_modeled) howto_modeled(f, s);
    fprintf(f, "\n");
}
