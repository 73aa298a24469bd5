/* SVG plots of the evaluation reports: a frame with ticks and labels on both axes, the legend at
 * the right; the plot area takes the width the legend leaves. */
#ifndef DFL_EVAL_SVG_H
#define DFL_EVAL_SVG_H

#include <stdio.h>

#define SVG_N_COLORS 10
extern const char *const svg_colors[SVG_N_COLORS];

typedef struct plot {
    double W, H, x0, y0, pw, ph;
} plot;

/* Opens the SVG: legend entries n_leg with the longest legend text leg_chars characters. */
plot plot_begin(FILE *f, const char *title, int n_leg, int leg_chars);
/* The geometry of a plot whose title line starts at pixel top (panels stacked in one SVG): H is
 * its bottom. */
plot plot_layout(double top, int n_leg, int leg_chars);
/* The <svg> element of a W x H drawing on white. */
void svg_begin(FILE *f, double W, double H);
/* A plot's title, above its frame. */
void plot_title(FILE *f, const plot *p, const char *title);
/* s as SVG text content (&, <, > escaped: legends are paths). */
void svg_text(FILE *f, const char *s);
void plot_labels(FILE *f, const plot *p, const char *xlabel, const char *ylabel);
/* A tick with its value on the y axis at pixel y, with a grid line across the plot. */
void plot_ytick(FILE *f, const plot *p, double y, const char *label);
/* A tick with its value on the x axis at pixel x. */
void plot_xtick(FILE *f, const plot *p, double x, const char *label);
void plot_legend(FILE *f, const plot *p, int i, const char *color, const char *text);

#endif
