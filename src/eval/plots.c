/* The SVG plots of the evaluation reports: per-position acceptance (chain and DDTree apart: their
 * rates mean different things), per-response τ histograms (a small panel per row, however many
 * rows), τ against the tree budget. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "report.h"
#include "svg.h"

#define NAME_LEN 256

/* The last k components of path (trailing slashes ignored; all of them when it has fewer). */
static void path_suffix(const char *p, int k, char *out, size_t n) {
    size_t len = strlen(p);
    while (len > 1 && p[len - 1] == '/') len--;
    size_t start = len;
    for (int c = 0; c < k && start > 0; c++) {
        if (c) start--; /* the slash before the component just taken */
        while (start > 0 && p[start - 1] != '/') start--;
    }
    snprintf(out, n, "%.*s", (int)(len - start), p + start);
}

/* A drafter's name shortened to k path components: "mtp (DIR)" keeps its wrapper. */
static void short_drafter(const char *d, int k, char *out, size_t n) {
    const size_t len = strlen(d);
    if (strncmp(d, "mtp (", 5) == 0 && len > 6 && d[len - 1] == ')') {
        char in[NAME_LEN], sh[NAME_LEN];
        snprintf(in, sizeof in, "%.*s", (int)(len - 6), d + 5);
        path_suffix(in, k, sh, sizeof sh);
        snprintf(out, n, "mtp (%.240s)", sh);
    } else {
        path_suffix(d, k, out, n);
    }
}

/* Legend names of the rows (names[k] for agg k): each drafter by the shortest path suffix that
 * tells it from every other drafter (two ".../final" checkpoints: "a/final", "b/final"), marked
 * like its table label. */
static void legend_names(const eval_summary *s, char (*names)[NAME_LEN]) {
    char(*sh)[NAME_LEN] = calloc((size_t)s->n_agg, sizeof *sh);
    int k = 1, clash = 1;
    for (; sh && clash && k <= 64; k++) {
        clash = 0;
        for (int i = 1; i < s->n_agg; i++) short_drafter(s->agg[i].drafter, k, sh[i], NAME_LEN);
        for (int i = 1; i < s->n_agg && !clash; i++)
            for (int j = 1; j < i && !clash; j++)
                clash = strcmp(sh[i], sh[j]) == 0 && strcmp(s->agg[i].drafter, s->agg[j].drafter) != 0;
    }
    for (int i = 1; i < s->n_agg; i++) /* the full name when no suffix tells them apart */
        snprintf(names[i], NAME_LEN, "%.200s%.50s", sh && !clash ? sh[i] : s->agg[i].drafter,
                 s->agg[i].label + strlen(s->agg[i].drafter));
    free(sh);
}

static int is_tree(const eval_agg *a) { return strncmp(a->mode, "ddtree-", 7) == 0; }

/* The longest legend text of the rows in (trees: the DDTree rows, else the others), with the mode. */
static int legend_chars(const eval_summary *s, char (*names)[NAME_LEN], int trees) {
    int m = 0;
    for (int k = 1; k < s->n_agg; k++)
        if (is_tree(&s->agg[k]) == trees && (int)(strlen(names[k]) + 1 + strlen(s->agg[k].mode)) > m)
            m = (int)(strlen(names[k]) + 1 + strlen(s->agg[k].mode));
    return m;
}

static int rows_of(const eval_summary *s, int trees) {
    int n = 0;
    for (int k = 1; k < s->n_agg; k++) n += is_tree(&s->agg[k]) == trees;
    return n;
}

/* One panel of per_position.svg: the chain rows or the DDTree rows. */
static void position_panel(FILE *f, const eval_summary *s, char (*names)[NAME_LEN], const plot *pl, int trees,
                           int npos) {
    fprintf(f, "<g class=\"panel\" data-kind=\"%s\">\n", trees ? "ddtree" : "chain");
    plot_title(f, pl,
               trees ? "DDTree: acceptance at depth k GIVEN the tree reached depth k (conditional; not "
                       "comparable with the chain's)"
                     : "Chain: acceptance at draft position k (marginal: every round proposes k)");
    char lab[32];
    for (int i = 0; i <= 10; i += 2) {
        snprintf(lab, sizeof lab, "%.1f", i / 10.0);
        plot_ytick(f, pl, pl->y0 + pl->ph - pl->ph * i / 10.0, lab);
    }
#define PX(p) (pl->x0 + pl->pw * ((p)-0.5) / npos)
#define PY(v) (pl->y0 + pl->ph - pl->ph * (v))
    for (int p = 1; p <= npos; p++) {
        snprintf(lab, sizeof lab, "%d", p);
        plot_xtick(f, pl, PX(p), lab);
    }
    plot_labels(f, pl, trees ? "tree depth k" : "draft position k",
                trees ? "accepted at depth k / rounds that reached depth k" : "accepted at k / rounds");
    for (int k = 1, i = 0; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        if (is_tree(a) != trees) continue;
        const char *c = svg_colors[(k - 1) % SVG_N_COLORS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", c);
        for (int p = 1; p < a->max_block; p++)
            if (a->pos_drafted[p]) fprintf(f, "%.1f,%.1f ", PX(p), PY(report_per_pos(a, p)));
        fprintf(f, "\"/>\n");
        for (int p = 1; p < a->max_block; p++)
            if (a->pos_drafted[p])
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", PX(p), PY(report_per_pos(a, p)),
                        c);
        char text[NAME_LEN + 40];
        snprintf(text, sizeof text, "%s %s", names[k], a->mode);
        plot_legend(f, pl, i++, c, text);
    }
#undef PX
#undef PY
    fprintf(f, "</g>\n");
}

/* Per-position acceptance: a panel of chain rows (marginal rates) and one of DDTree rows (rates
 * conditional on the tree reaching the depth), one above the other; positions a mode never
 * proposed are left out, not drawn as 0. */
int plot_per_position(const eval_summary *s, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return dfl_seterr("%s: cannot create", path);
    char(*names)[NAME_LEN] = calloc((size_t)s->n_agg, sizeof *names);
    if (!names) {
        fclose(f);
        return dfl_seterr("out of memory");
    }
    legend_names(s, names);
    const int npos = report_max_proposed(s) > 0 ? report_max_proposed(s) : 1;
    const int nc = rows_of(s, 0), nt = rows_of(s, 1);
    const plot pc = plot_layout(0, nc, legend_chars(s, names, 0));
    const plot pt = plot_layout(nc ? pc.H : 0, nt, legend_chars(s, names, 1));
    svg_begin(f, 1000, nt ? pt.H : pc.H);
    if (nc || !nt) position_panel(f, s, names, &pc, 0, npos);
    if (nt) position_panel(f, s, names, &pt, 1, npos);
    fprintf(f, "</svg>\n");
    free(names);
    return report_close(f, path);
}

/* A tick step of 1, 2 or 5 x 10^k giving at most about 6 ticks up to top. */
static int nice_step(int top) {
    for (int m = 1;; m *= 10) {
        if (top <= 6 * m) return m;
        if (top <= 12 * m) return 2 * m;
        if (top <= 30 * m) return 5 * m;
    }
}

/* One small histogram: a row's per-response τ counts (cnt[nbins]) in the cell pl. */
static void hist_cell(FILE *f, const plot *pl, const int *cnt, int nbins, int ytop, int maxb, const char *color,
                      const char *title) {
    fprintf(f, "<text class=\"legend\" x=\"%.1f\" y=\"%.1f\" fill=\"%s\">", pl->x0, pl->y0 - 6, color);
    svg_text(f, title);
    fprintf(f,
            "</text>\n<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#333\"/>\n",
            pl->x0, pl->y0, pl->pw, pl->ph);
    char lab[32];
    for (int v = 0; v <= ytop; v += ytop) {
        snprintf(lab, sizeof lab, "%d", v);
        plot_ytick(f, pl, pl->y0 + pl->ph - pl->ph * v / (double)ytop, lab);
    }
    const int xs = maxb <= 9 ? 1 : maxb <= 17 ? 2 : 4;
    for (int t = 1; t <= maxb; t += xs) {
        snprintf(lab, sizeof lab, "%d", t);
        plot_xtick(f, pl, pl->x0 + pl->pw * (t - 1) / (double)(maxb - 1), lab);
    }
    const double bw = pl->pw / (2.0 * (maxb - 1)), yb = pl->y0 + pl->ph;
    fprintf(f, "<polyline fill=\"%s\" fill-opacity=\"0.35\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%.1f,%.1f ",
            color, color, pl->x0, yb);
    for (int b = 0; b < nbins; b++) {
        const double y = yb - pl->ph * cnt[b] / (double)ytop;
        const double xa = pl->x0 + bw * b, xe = xa + bw > pl->x0 + pl->pw ? pl->x0 + pl->pw : xa + bw;
        fprintf(f, "%.1f,%.1f %.1f,%.1f ", xa, y, xe, y);
    }
    fprintf(f, "%.1f,%.1f\"/>\n", pl->x0 + pl->pw, yb);
}

/* Histograms of per-response τ (bins of 0.5): a small panel per drafter x mode, on shared axes,
 * one to four in a column, more in two or three columns, so that any number of rows stays readable. */
int plot_tau_hist(const eval_summary *s, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return dfl_seterr("%s: cannot create", path);
    const int n = s->n_agg - 1 > 0 ? s->n_agg - 1 : 1;
    int maxb = 2;
    for (int k = 1; k < s->n_agg; k++) maxb = s->agg[k].max_block > maxb ? s->agg[k].max_block : maxb;
    const int nbins = 2 * (maxb - 1) + 1; /* tau in [1, maxb] */
    int *cnt = calloc((size_t)s->n_agg * nbins, sizeof(int)), top = 1;
    char(*names)[NAME_LEN] = calloc((size_t)s->n_agg, sizeof *names);
    if (!cnt || !names) {
        free(cnt), free(names), fclose(f);
        return dfl_seterr("out of memory");
    }
    legend_names(s, names);
    for (int k = 1; k < s->n_agg; k++)
        for (int i = 0; i < s->agg[k].responses; i++) {
            int b = (int)((s->agg[k].resp[i].tau - 1.0) * 2.0);
            b = b < 0 ? 0 : b >= nbins ? nbins - 1 : b;
            if (++cnt[k * nbins + b] > top) top = cnt[k * nbins + b];
        }
    const int ytop = (top + nice_step(top) - 1) / nice_step(top) * nice_step(top);
    const int cols = n <= 4 ? 1 : n <= 8 ? 2 : 3, rows = (n + cols - 1) / cols;
    const double x0 = 72, cw = (1000 - x0 - 16) / cols, ch = 170, top0 = 34;
    svg_begin(f, 1000, top0 + rows * ch + 40);
    fprintf(f,
            "<text class=\"title\" x=\"%.0f\" y=\"20\" font-size=\"14\">Per-response τ (responses per 0.5 bin), a "
            "panel per drafter × mode on the same axes</text>\n",
            x0);
    for (int k = 1; k < s->n_agg; k++) {
        const int i = k - 1;
        const plot pl = {.W = 1000,
                         .x0 = x0 + cw * (i % cols) + (i % cols ? 40 : 0),
                         .y0 = top0 + 22 + ch * (i / cols),
                         .pw = cw - (i % cols ? 56 : 16),
                         .ph = ch - 70};
        char title[NAME_LEN + 64];
        snprintf(title, sizeof title, "%s %s (τ %.2f)", names[k], s->agg[k].mode, eval_agg_tau(&s->agg[k]));
        hist_cell(f, &pl, cnt + k * nbins, nbins, ytop, maxb, svg_colors[i % SVG_N_COLORS], title);
    }
    const double yb = top0 + rows * ch;
    fprintf(f,
            "<text class=\"xlabel\" x=\"500\" y=\"%.1f\" text-anchor=\"middle\">per-response τ (tokens per "
            "round)</text>\n<text class=\"ylabel\" x=\"18\" y=\"%.1f\" transform=\"rotate(-90 18 %.1f)\" "
            "text-anchor=\"middle\">responses</text>\n</svg>\n",
            yb + 20, yb / 2, yb / 2);
    free(cnt), free(names);
    return report_close(f, path);
}

/* The DDTree rows of drafter label: budgets ascending with their τ into bs, ts; its chain row
 * into *chain (or NULL) and any row into *any. */
static int budget_rows(const eval_summary *s, const char *label, int *bs, double *ts, int max, const eval_agg **chain,
                       const eval_agg **any) {
    int n = 0;
    *chain = *any = NULL;
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        if (strcmp(a->label, label) != 0) continue;
        *any = a;
        if (strcmp(a->mode, "chain") == 0) *chain = a;
        else if (is_tree(a) && n < max) {
            int j = n++;
            const int b = atoi(a->mode + 7);
            while (j > 0 && bs[j - 1] > b) bs[j] = bs[j - 1], ts[j] = ts[j - 1], j--;
            bs[j] = b, ts[j] = eval_agg_tau(a);
        }
    }
    return n;
}

/* τ against the tree budget (log scale), a line per drafter; its chain τ as a dashed line. */
int plot_tau_budget(const eval_summary *s, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return dfl_seterr("%s: cannot create", path);
    const char **labels = calloc((size_t)s->n_agg + 1, sizeof *labels);
    char(*names)[NAME_LEN] = calloc((size_t)s->n_agg, sizeof *names);
    if (!labels || !names) {
        free(labels), free(names), fclose(f);
        return dfl_seterr("out of memory");
    }
    legend_names(s, names);
    const int nd = report_distinct(s, 1, labels);
    int bmax = 1, bmin = 1 << 30, lchars = 0;
    double tmax = 1;
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        if (is_tree(a) && atoi(a->mode + 7) > bmax) bmax = atoi(a->mode + 7);
        if (is_tree(a) && atoi(a->mode + 7) < bmin) bmin = atoi(a->mode + 7);
        if (eval_agg_tau(a) > tmax) tmax = eval_agg_tau(a);
        if ((int)strlen(names[k]) > lchars) lchars = (int)strlen(names[k]);
    }
    /* the x axis spans the powers of two around the budgets run */
    const int l0 = bmin < bmax ? (int)floor(log2((double)bmin)) : 0;
    int lb = (int)ceil(log2((double)bmax));
    if (lb <= l0) lb = l0 + 1;
    const int ymax = (int)tmax + 1;
    const plot pl = plot_begin(f, "τ against the DDTree budget (dashed: chain)", nd, lchars);
#define BX(b) (pl.x0 + pl.pw * (0.03 + 0.94 * (log2((double)(b)) - l0) / (lb - l0)))
#define TY(t) (pl.y0 + pl.ph - pl.ph * ((t)-1.0) / (ymax - 1.0))
    char lab[32];
    for (int t = 1; t <= ymax; t += ymax > 12 ? 2 : 1) {
        snprintf(lab, sizeof lab, "%d", t);
        plot_ytick(f, &pl, TY(t), lab);
    }
    for (int e = l0; e <= lb; e++) {
        snprintf(lab, sizeof lab, "%d", 1 << e);
        plot_xtick(f, &pl, BX(1 << e), lab);
    }
    plot_labels(f, &pl, "tree budget (draft nodes, log scale)", "τ (tokens per round)");
    for (int i = 0; i < nd; i++) {
        const char *c = svg_colors[i % SVG_N_COLORS];
        int bs[EVAL_MAX_MODES * 4];
        double ts[EVAL_MAX_MODES * 4];
        const eval_agg *chain, *any;
        const int n = budget_rows(s, labels[i], bs, ts, EVAL_MAX_MODES * 4, &chain, &any);
        if (n) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", c);
            for (int j = 0; j < n; j++) fprintf(f, "%.1f,%.1f ", BX(bs[j]), TY(ts[j]));
            fprintf(f, "\"/>\n");
            for (int j = 0; j < n; j++)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", BX(bs[j]), TY(ts[j]), c);
        }
        if (chain)
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"6,4\"/>\n",
                    pl.x0, TY(eval_agg_tau(chain)), pl.x0 + pl.pw, TY(eval_agg_tau(chain)), c);
        plot_legend(f, &pl, i, c, names[any - s->agg]);
    }
#undef BX
#undef TY
    fprintf(f, "</svg>\n");
    free(labels), free(names);
    return report_close(f, path);
}
