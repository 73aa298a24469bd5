/* SVG plots of the evaluation reports (src/eval/svg.h). */
#include "svg.h"

const char *const svg_colors[SVG_N_COLORS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                              "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

plot plot_layout(double top, int n_leg, int leg_chars) {
    plot p = {.W = 1000, .x0 = 72, .y0 = top + 34, .ph = 330};
    double lw = 48 + 6.6 * leg_chars;
    lw = lw < 150 ? 150 : lw > 420 ? 420 : lw;
    p.pw = p.W - p.x0 - lw - 16;
    if (18.0 * n_leg + 10 > p.ph) p.ph = 18.0 * n_leg + 10; /* a long legend makes the plot taller */
    p.H = p.y0 + p.ph + 52;
    return p;
}

void svg_begin(FILE *f, double W, double H) {
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
}

void svg_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else fputc(*s, f);
    }
}

void plot_title(FILE *f, const plot *p, const char *title) {
    fprintf(f, "<text class=\"title\" x=\"%.0f\" y=\"%.0f\" font-size=\"14\">", p->x0, p->y0 - 14);
    svg_text(f, title);
    fputs("</text>\n", f);
}

/* Opens the SVG: legend entries n_leg with the longest legend text leg_chars characters. */
plot plot_begin(FILE *f, const char *title, int n_leg, int leg_chars) {
    const plot p = plot_layout(0, n_leg, leg_chars);
    svg_begin(f, p.W, p.H);
    plot_title(f, &p, title);
    return p;
}

void plot_labels(FILE *f, const plot *p, const char *xlabel, const char *ylabel) {
    fprintf(f,
            "<rect class=\"frame\" x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
            "stroke=\"#333\"/>\n",
            p->x0, p->y0, p->pw, p->ph);
    fprintf(f, "<text class=\"xlabel\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", p->x0 + p->pw / 2,
            p->y0 + p->ph + 40, xlabel);
    fprintf(f,
            "<text class=\"ylabel\" x=\"18\" y=\"%.1f\" transform=\"rotate(-90 18 %.1f)\" "
            "text-anchor=\"middle\">%s</text>\n",
            p->y0 + p->ph / 2, p->y0 + p->ph / 2, ylabel);
}

/* A tick with its value on the y axis at pixel y, with a grid line across the plot. */
void plot_ytick(FILE *f, const plot *p, double y, const char *label) {
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", p->x0, y, p->x0 + p->pw,
            y);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", p->x0 - 5, y, p->x0, y);
    fprintf(f, "<text class=\"ytick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p->x0 - 8, y + 4, label);
}

/* A tick with its value on the x axis at pixel x. */
void plot_xtick(FILE *f, const plot *p, double x, const char *label) {
    const double yb = p->y0 + p->ph;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, yb, x, yb + 5);
    fprintf(f, "<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, yb + 19, label);
}

void plot_legend(FILE *f, const plot *p, int i, const char *color, const char *text) {
    const double ly = p->y0 + 14 + 18 * i, lx = p->x0 + p->pw + 14;
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n", lx, ly - 4,
            lx + 20, ly - 4, color);
    fprintf(f, "<text class=\"legend\" x=\"%.0f\" y=\"%.1f\">", lx + 26, ly);
    svg_text(f, text);
    fputs("</text>\n", f);
}
