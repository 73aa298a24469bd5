/* "Training vs serving": the training-time metrics next to the serving replay's tau, the gap
 * taken apart one factor at a time (include/dfl/train_metrics.h, docs/train-vs-serve.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"
#include "dfl/train_metrics.h"
#include "svg.h"

static const tm_agg *find_set(const tm_report_in *in, const char *drafter, const char *labels, const char *features,
                              int alt_attn) {
    for (int i = 0; i < in->n; i++) {
        const tm_agg *a = &in->ag[i];
        if (strcmp(a->drafter, drafter) == 0 && strcmp(a->labels, labels) == 0 && strcmp(a->features, features) == 0 &&
            (strcmp(a->attn, "config") != 0) == alt_attn)
            return a;
    }
    return NULL;
}

/* The chain replay of drafter at block B on these features (token-weighted tau), NULL if none. */
static const eval_agg *serving(const eval_summary *s, const char *drafter, const char *features) {
    for (int i = 1; s && i < s->n_agg; i++) {
        const eval_agg *a = &s->agg[i];
        if (strcmp(a->drafter, drafter) == 0 && strcmp(a->mode, "chain") == 0 && strcmp(a->method, "replay") == 0 &&
            strcmp(a->features, features) == 0)
            return a;
    }
    return NULL;
}

/* The waterfall of one drafter: from the most training-like number to the serving tau. */
typedef struct wrow {
    const char *step, *factor;
    double v;
} wrow;

static int waterfall(const tm_report_in *in, const char *d, wrow *w) {
    const tm_agg *t = find_set(in, d, "target", "dfl", 0), *ds = find_set(in, d, "dataset", "dfl", 0);
    const eval_agg *sv = serving(in->s, d, "dfl");
    int n = 0;
    if (!t) return 0;
    if (ds) w[n++] = (wrow){"dataset labels, SpecForge's random anchors (training's view)", "", tm_sim_len(&ds->rnd)};
    w[n++] =
        (wrow){"the target's greedy labels, random anchors", "labels: dataset -> target greedy", tm_sim_len(&t->rnd)};
    w[n++] = (wrow){"every anchor", "anchor sampling", tm_sim_len(&t->all)};
    w[n++] = (wrow){"the serving walk's round starts", "where rounds start (after a rejection)", tm_sim_len(&t->walk)};
    if (sv) w[n++] = (wrow){"the replay's chain tau", "shorter blocks near --max-new", eval_agg_tau_tokens(sv)};
    return n;
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6f", v);
    else fputs("null", f);
}

static void json_per_k(FILE *f, const char *name, const tm_counts *c, int B, int what) {
    fprintf(f, ", \"%s\": [", name);
    for (int k = 1; k < B; k++) {
        double v = NAN;
        if (what == 0 && c->valid[k]) v = (double)c->correct[k] / c->valid[k];         /* accuracy */
        if (what == 1 && c->cont[k]) v = (double)c->reach[k] / c->cont[k];             /* conditional */
        if (what == 2 && c->valid[k]) v = (double)c->reach[k] / c->valid[k];           /* marginal */
        if (what == 3 && c->exp_anchors && c->valid[k]) v = c->alpha[k] / c->valid[k]; /* alpha */
        if (what == 4 && c->exp_anchors && c->valid[k]) v = c->left[k] / c->valid[k];  /* left out */
        if (k > 1) fputs(", ", f);
        json_num(f, v);
    }
    fputc(']', f);
}

static void json_counts(FILE *f, const char *name, const tm_counts *c, int B, double gamma) {
    fprintf(f, "\"%s\": {\"anchors\": %ld, \"accuracy\": ", name, c->anchors);
    json_num(f, tm_accuracy(c, B));
    fputs(", \"accuracy_weighted\": ", f);
    json_num(f, tm_accuracy_weighted(c, B, gamma));
    fputs(", \"simulated_acceptance_length\": ", f);
    json_num(f, tm_sim_len(c));
    fputs(", \"length_from_accuracy\": ", f);
    json_num(f, tm_naive_len(c, B));
    fputs(", \"expected_length_t1\": ", f);
    json_num(f, c->exp_anchors ? tm_exp_len(c) : NAN);
    json_per_k(f, "accuracy_per_k", c, B, 0);
    json_per_k(f, "conditional_per_k", c, B, 1);
    json_per_k(f, "marginal_per_k", c, B, 2);
    if (c->exp_anchors) json_per_k(f, "alpha_per_k", c, B, 3), json_per_k(f, "target_mass_left_out_per_k", c, B, 4);
    fputc('}', f);
}

static void json_drafter(FILE *f, const tm_report_in *in, const char *d) {
    fputs("{\"drafter\": ", f);
    dfl_json_write_string(f, d);
    fputs(", \"sets\": [", f);
    int first = 1;
    for (int i = 0; i < in->n; i++) {
        const tm_agg *a = &in->ag[i];
        if (strcmp(a->drafter, d) != 0) continue;
        fprintf(f,
                "%s{\"labels\": \"%s\", \"features\": \"%s\", \"attn\": \"%s\", \"block_size\": %d, "
                "\"responses\": %d, \"draft_s\": %.6f, \"drafts\": %ld, ",
                first ? "" : ", ", a->labels, a->features, a->attn, a->B, a->responses, a->draft_s, a->drafts);
        json_counts(f, "random_anchors", &a->rnd, a->B, in->gamma);
        fputs(", ", f);
        json_counts(f, "all_anchors", &a->all, a->B, in->gamma);
        fputs(", ", f);
        json_counts(f, "serving_walk", &a->walk, a->B, in->gamma);
        fputc('}', f);
        first = 0;
    }
    fputs("], \"waterfall\": [", f);
    wrow w[8];
    const int n = waterfall(in, d, w);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s{\"step\": ", i ? ", " : "");
        dfl_json_write_string(f, w[i].step);
        fputs(", \"factor\": ", f);
        dfl_json_write_string(f, w[i].factor);
        fputs(", \"value\": ", f);
        json_num(f, w[i].v);
        fputs(", \"delta\": ", f);
        json_num(f, i ? w[i].v - w[i - 1].v : 0);
        fputc('}', f);
    }
    fputs("]", f);
    const eval_agg *sv = serving(in->s, d, "dfl"), *sp = serving(in->s, d, "pipeline");
    if (sv) fprintf(f, ", \"serving_chain_tau\": %.6f", eval_agg_tau_tokens(sv));
    if (sp) fprintf(f, ", \"serving_chain_tau_pipeline_features\": %.6f", eval_agg_tau_tokens(sp));
    fputc('}', f);
}

static int drafters(const tm_report_in *in, const char **out) {
    int n = 0;
    for (int i = 0; i < in->n; i++) {
        int seen = 0;
        for (int j = 0; j < n && !seen; j++) seen = strcmp(out[j], in->ag[i].drafter) == 0;
        if (!seen && n < EVAL_MAX_DRAFTERS) out[n++] = in->ag[i].drafter;
    }
    return n;
}

void tm_report_json(const tm_report_in *in, FILE *f) {
    fprintf(f,
            "\"train_vs_serve\": {\"gamma\": %g, \"num_anchors\": %d, \"seed\": %llu, \"target_top_k\": %d, "
            "\"drafters\": [",
            in->gamma, in->num_anchors, (unsigned long long)in->seed, in->top_k);
    const char *d[EVAL_MAX_DRAFTERS];
    const int nd = drafters(in, d);
    for (int i = 0; i < nd; i++) {
        if (i) fputs(", ", f);
        json_drafter(f, in, d[i]);
    }
    fputs("]}", f);
}

/* ---- summary.md ---------------------------------------------------------------------------- */

static void md_row(FILE *f, const char *what, const tm_counts *c, int B, double gamma) {
    fprintf(f, "| %s | %ld | %.3f | %.3f | %.3f | %.3f | ", what, c->anchors, tm_accuracy(c, B),
            tm_accuracy_weighted(c, B, gamma), tm_naive_len(c, B), tm_sim_len(c));
    if (c->exp_anchors) fprintf(f, "%.3f |\n", tm_exp_len(c));
    else fputs("n/a |\n", f);
}

static void md_sets(FILE *f, const tm_report_in *in, const char *d) {
    fputs("| set | anchors | accuracy (SpecForge) | weighted accuracy | 1 + sum prod acc_k | simulated acceptance "
          "length | expected length at T = 1 |\n|---|---|---|---|---|---|---|\n",
          f);
    for (int i = 0; i < in->n; i++) {
        const tm_agg *a = &in->ag[i];
        if (strcmp(a->drafter, d) != 0) continue;
        char what[160];
        snprintf(what, sizeof what, "%s labels, %s features%s%s", a->labels, a->features,
                 strcmp(a->attn, "config") ? ", block attention " : "", strcmp(a->attn, "config") ? a->attn : "");
        char row[200];
        snprintf(row, sizeof row, "%s, random anchors", what);
        md_row(f, row, &a->rnd, a->B, in->gamma);
        snprintf(row, sizeof row, "%s, every anchor", what);
        md_row(f, row, &a->all, a->B, in->gamma);
        snprintf(row, sizeof row, "%s, serving walk", what);
        md_row(f, row, &a->walk, a->B, in->gamma);
    }
}

static void md_per_k(FILE *f, const tm_agg *t, const eval_agg *sv) {
    const int B = t->B;
    fputs("\n| k |", f);
    for (int k = 1; k < B; k++) fprintf(f, " %d |", k);
    fputs("\n|---|", f);
    for (int k = 1; k < B; k++) fputs("---|", f);
    const char *names[] = {"accuracy (random anchors)", "conditional (every anchor)", "marginal (every anchor)",
                           "serving (replay, marginal)"};
    for (int r = 0; r < 4; r++) {
        if (r == 3 && !sv) break;
        fprintf(f, "\n| %s |", names[r]);
        for (int k = 1; k < B; k++) {
            const tm_counts *c = r == 0 ? &t->rnd : &t->all;
            double v = -1;
            if (r == 0 && c->valid[k]) v = (double)c->correct[k] / c->valid[k];
            if (r == 1 && c->cont[k]) v = (double)c->reach[k] / c->cont[k];
            if (r == 2 && c->valid[k]) v = (double)c->reach[k] / c->valid[k];
            if (r == 3 && k < sv->max_block && sv->pos_drafted[k]) v = (double)sv->pos_accepted[k] / sv->pos_drafted[k];
            if (v >= 0) fprintf(f, " %.3f |", v);
            else fputs(" |", f);
        }
    }
    fputs("\n", f);
}

/* The factor with the largest effect, in words. */
static void md_verdict(FILE *f, const wrow *w, int n, const char *extra_factor, double extra_delta) {
    int best = -1;
    double bd = 0;
    for (int i = 1; i < n; i++)
        if (fabs(w[i].v - w[i - 1].v) > fabs(bd)) bd = w[i].v - w[i - 1].v, best = i;
    if (extra_factor && fabs(extra_delta) > fabs(bd)) {
        fprintf(f, "\n**What moved tau most: %s (%+.3f).**", extra_factor, extra_delta);
        return;
    }
    if (best > 0) fprintf(f, "\n**What moved tau most: %s (%+.3f).**", w[best].factor, bd);
    else fputs("\n**No factor moved tau here.**", f);
}

static void md_drafter(FILE *f, const tm_report_in *in, const char *d) {
    const tm_agg *t = find_set(in, d, "target", "dfl", 0), *ds = find_set(in, d, "dataset", "dfl", 0);
    const tm_agg *tp = find_set(in, d, "target", "pipeline", 0), *ta = find_set(in, d, "target", "dfl", 1);
    const eval_agg *sv = serving(in->s, d, "dfl"), *sp = serving(in->s, d, "pipeline");
    fprintf(f, "\n### %s\n\n", d);
    if (!t) {
        fputs("No training metrics on the target's greedy labels for this drafter.\n", f);
        return;
    }
    const tm_agg *tr = ds ? ds : t; /* the most training-like set */
    fprintf(f,
            "A training run on %s labels would log accuracy **%.3f** (SpecForge: pooled over positions 1..%d, "
            "unweighted; %.3f with its loss weights), which is a per-token rate, not a length: read as one, "
            "1 + sum_k prod_j acc_j gives %.3f. Counted as acceptance (1 + the leading run of correct drafts) "
            "it is %.3f per block. ",
            tr == ds ? "dataset" : "the target's greedy", tm_accuracy(&tr->rnd, tr->B), tr->B - 1,
            tm_accuracy_weighted(&tr->rnd, tr->B, in->gamma), tm_naive_len(&tr->rnd, tr->B), tm_sim_len(&tr->rnd));
    if (sv)
        fprintf(f, "The serving replay (chain, block %d) accepts **%.3f** tokens per round.\n\n", sv->max_block,
                eval_agg_tau_tokens(sv));
    else fputs("No chain replay ran (add --tree-budget 0 for the serving tau).\n\n", f);
    wrow w[8];
    const int n = waterfall(in, d, w);
    fputs("| step (one factor changed at a time) | acceptance length | delta | factor |\n|---|---|---|---|\n", f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "| %s | %.3f | ", w[i].step, w[i].v);
        if (i) fprintf(f, "%+.3f | %s |\n", w[i].v - w[i - 1].v, w[i].factor);
        else fputs(" | |\n", f);
    }
    const char *xf = NULL;
    double xd = 0;
    if (tp) {
        const double d1 = tm_sim_len(&t->rnd) - tm_sim_len(&tp->rnd);
        fprintf(f,
                "| *with the pipeline's features (--features-from) instead of dfl's:* random anchors | %.3f | %+.3f "
                "vs dfl's | features |\n",
                tm_sim_len(&tp->rnd), -d1);
        if (sp && sv) {
            const double d2 = eval_agg_tau_tokens(sv) - eval_agg_tau_tokens(sp);
            fprintf(f,
                    "| *with the pipeline's features:* the replay's chain tau | %.3f | %+.3f vs dfl's | features |\n",
                    eval_agg_tau_tokens(sp), -d2);
            xf = "the pipeline's features vs dfl's", xd = -d2;
        }
    }
    const tm_agg *tc = find_set(in, d, "template", "dfl", 0);
    if (tc) {
        const double d1 = tm_sim_len(&tc->rnd) - tm_sim_len(&t->rnd);
        const int none = strcmp(in->alt_chat, "none") == 0;
        fprintf(f, "| *the prompt %s%s%s (the response the same):* random anchors | %.3f | %+.3f | chat template |\n",
                none ? "without a chat template" : "in the ", none ? "" : in->alt_chat, none ? "" : " template",
                tm_sim_len(&tc->rnd), d1);
        if (fabs(d1) > fabs(xd)) xf = "the chat template the prompts were rendered with", xd = d1;
    }
    if (ta) {
        const double d1 = tm_sim_len(&ta->walk) - tm_sim_len(&t->walk);
        fprintf(f,
                "| *with block attention %s:* the serving walk | %.3f | %+.3f | block attention in sliding layers |\n",
                ta->attn, tm_sim_len(&ta->walk), d1);
        if (fabs(d1) > fabs(xd)) xf = "the drafter's block attention in sliding layers", xd = d1;
    }
    md_verdict(f, w, n, xf, xd);
    if (t->all.exp_anchors)
        fprintf(f,
                " Sampling at temperature 1 the drafter would be expected to get %.3f per block (every anchor, "
                "DeepSpec's 1 + sum prod (1 - TV), a lower bound: the target's top-%d leave %.2g of its mass out on "
                "average).",
                tm_exp_len(&t->all), in->top_k, t->all.valid[1] ? t->all.left[1] / t->all.valid[1] : 0.0);
    fputs("\n\n", f);
    md_sets(f, in, d);
    md_per_k(f, t, sv);
    if (tp && sp && sv && eval_agg_tau_tokens(sp) < 0.8 * eval_agg_tau_tokens(sv))
        fprintf(
            f,
            "\n**Warning:** on the pipeline's features the serving tau falls to %.3f from %.3f on dfl's: the "
            "pipeline's hidden states are not the target's (see the features check below, docs/train-vs-serve.md).\n",
            eval_agg_tau_tokens(sp), eval_agg_tau_tokens(sv));
}

void tm_report_md(const tm_report_in *in, FILE *f) {
    fprintf(f,
            "\n## Training vs serving\n\nThe numbers drafter training logs, computed on the same recorded "
            "sequences and features as the replay (docs/train-vs-serve.md). Anchors: positions p with p and p + 1 in "
            "the response; random anchors: at most %d per response, seed %llu (SpecForge's sampling); loss weights "
            "exp(-(k-1)/%g). Acceptance lengths count the anchor's own token (1 + accepted drafts).\n",
            in->num_anchors, (unsigned long long)in->seed, in->gamma);
    if (in->exp_note[0]) fprintf(f, "\n%s\n", in->exp_note);
    const char *d[EVAL_MAX_DRAFTERS];
    const int nd = drafters(in, d);
    for (int i = 0; i < nd; i++) md_drafter(f, in, d[i]);
    if (in->cost_note[0]) fprintf(f, "\n%s\n", in->cost_note);
    fputs("\nPlot: train_vs_serve.svg.\n", f);
}

/* ---- train_vs_serve.svg: per-position training accuracy against serving acceptance ---------- */

int tm_report_svg(const tm_report_in *in, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return dfl_seterr("%s: cannot create", path);
    const char *d[EVAL_MAX_DRAFTERS];
    const int nd = drafters(in, d);
    int npos = 1;
    for (int i = 0; i < in->n; i++) npos = in->ag[i].B - 1 > npos ? in->ag[i].B - 1 : npos;
    const plot pl = plot_begin(f, "Training accuracy per position (solid) vs serving acceptance (dashed)", 2 * nd, 48);
    char lab[32];
    for (int i = 0; i <= 10; i += 2) {
        snprintf(lab, sizeof lab, "%.1f", i / 10.0);
        plot_ytick(f, &pl, pl.y0 + pl.ph - pl.ph * i / 10.0, lab);
    }
    for (int p = 1; p <= npos; p++) {
        snprintf(lab, sizeof lab, "%d", p);
        plot_xtick(f, &pl, pl.x0 + pl.pw * (p - 0.5) / npos, lab);
    }
    plot_labels(f, &pl, "block position k", "rate");
    for (int i = 0; i < nd; i++) {
        const tm_agg *ds = find_set(in, d[i], "dataset", "dfl", 0), *t = find_set(in, d[i], "target", "dfl", 0);
        const tm_agg *tr = ds ? ds : t;
        const eval_agg *sv = serving(in->s, d[i], "dfl");
        const char *c = svg_colors[i % SVG_N_COLORS];
        for (int s = 0; s < 2; s++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", c,
                    s ? " stroke-dasharray=\"6,4\"" : "");
            for (int k = 1; tr && k < tr->B; k++) {
                double v = -1;
                if (s == 0 && tr->rnd.valid[k]) v = (double)tr->rnd.correct[k] / tr->rnd.valid[k];
                if (s == 1 && sv && k < sv->max_block && sv->pos_drafted[k])
                    v = (double)sv->pos_accepted[k] / sv->pos_drafted[k];
                if (v >= 0) fprintf(f, "%.1f,%.1f ", pl.x0 + pl.pw * (k - 0.5) / npos, pl.y0 + pl.ph - pl.ph * v);
            }
            fputs("\"/>\n", f);
            char text[600];
            snprintf(text, sizeof text, "%.28s: %s", d[i] + (strlen(d[i]) > 28 ? strlen(d[i]) - 28 : 0),
                     s          ? "serving acceptance"
                     : tr == ds ? "training accuracy (dataset)"
                                : "training accuracy");
            plot_legend(f, &pl, 2 * i + s, c, text);
        }
    }
    fputs("</svg>\n", f);
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad) return dfl_seterr("%s: write error", path);
    return DFL_OK;
}
