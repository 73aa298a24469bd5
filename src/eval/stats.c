/* Statistics of the evaluation reports (include/dfl/eval.h, docs/eval.md "Statistics"): per-prompt
 * τ, paired comparisons with a bootstrap interval over prompts, the loop test of an output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/eval.h"
#include "pyrandom.h"

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static int cmp_ptau(const void *x, const void *y) {
    return strcmp(((const eval_ptau *)x)->id, ((const eval_ptau *)y)->id);
}

int eval_prompt_taus(const eval_result *res, int n, const char *drafter, const char *mode, const char *method,
                     const char *features, eval_ptau **out) {
    eval_ptau *v = malloc(((size_t)n + 1) * sizeof *v);
    int *seen = calloc((size_t)n + 1, sizeof *seen), k = 0; /* per prompt: a bit per turn counted */
    if (!v || !seen) {
        free(v), free(seen);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const eval_result *r = &res[i];
        if (r->rep || strcmp(r->drafter, drafter) || strcmp(r->mode, mode) || strcmp(r->method, method) ||
            strcmp(r->features, features))
            continue;
        int j = 0;
        while (j < k && strcmp(v[j].id, r->prompt_id) != 0) j++;
        if (j == k) v[k++] = (eval_ptau){.id = r->prompt_id, .tau = 0};
        if (seen[j] & (1 << r->turn)) continue; /* a later copy of a response */
        seen[j] |= 1 << r->turn;
        v[j].tau += r->rounds ? (double)(r->tokens - 1) / r->rounds : 1.0; /* the mean over turns below */
    }
    for (int j = 0; j < k; j++) v[j].tau /= __builtin_popcount((unsigned)seen[j]);
    free(seen);
    qsort(v, (size_t)k, sizeof *v, cmp_ptau);
    *out = v;
    return k;
}

/* numpy.percentile's default: linear interpolation between the order statistics of sorted v. */
static double percentile(const double *v, int n, double q) {
    const double h = q * (n - 1);
    const int lo = (int)floor(h), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (h - lo) * (v[hi] - v[lo]);
}

void eval_bootstrap_mean(const double *d, int n, int resamples, int64_t seed, double ci[2]) {
    double mean = 0;
    for (int i = 0; i < n; i++) mean += d[i];
    mean = n ? mean / n : 0;
    double *m = n >= 2 && resamples >= 2 ? malloc((size_t)resamples * sizeof *m) : NULL;
    if (!m) {
        ci[0] = ci[1] = mean;
        return;
    }
    dfl_pyrandom rng;
    pyrandom_seed(&rng, seed);
    for (int r = 0; r < resamples; r++) {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += d[pyrandom_randbelow(&rng, (uint32_t)n)];
        m[r] = sum / n;
    }
    qsort(m, (size_t)resamples, sizeof *m, cmp_double);
    ci[0] = percentile(m, resamples, 0.025);
    ci[1] = percentile(m, resamples, 0.975);
    free(m);
}

void eval_paired_compare(const eval_ptau *a, int na, const eval_ptau *b, int nb, int resamples, int64_t seed,
                         eval_paired *p) {
    memset(p, 0, sizeof *p);
    double *d = malloc(((size_t)(na < nb ? na : nb) + 1) * sizeof *d);
    if (!d) return;
    for (int i = 0, j = 0; i < na && j < nb;) { /* both sorted by id: the prompts both have, in id order */
        const int c = strcmp(a[i].id, b[j].id);
        if (c) {
            c < 0 ? i++ : j++;
            continue;
        }
        p->tau_a += a[i].tau, p->tau_b += b[j].tau;
        d[p->n++] = b[j].tau - a[i].tau;
        i++, j++;
    }
    if (p->n) {
        p->tau_a /= p->n, p->tau_b /= p->n;
        for (int i = 0; i < p->n; i++) p->diff += d[i];
        p->diff /= p->n;
    }
    double ci[2];
    eval_bootstrap_mean(d, p->n, resamples, seed, ci);
    p->lo = ci[0], p->hi = ci[1];
    free(d);
}

void eval_paired_verdict(const eval_paired *p, const char *a, const char *b, char *out, size_t len) {
    static const char *const how = "τ per prompt: the mean over its turns of (tokens − 1) / rounds; 95% bootstrap "
                                   "interval over prompts";
    if (p->n < 2) {
        snprintf(out, len, "%s vs %s: %d prompt%s in common, too few for an interval", b, a, p->n,
                 p->n == 1 ? "" : "s");
    } else if (p->lo > 0 || p->hi < 0) {
        snprintf(out, len, "%s accepts %.2f ± %.2f %s tokens per round than %s on these %d prompts (%s [%+.2f, %+.2f])",
                 b, fabs(p->diff), (p->hi - p->lo) / 2, p->diff > 0 ? "more" : "fewer", a, p->n, how, p->lo, p->hi);
    } else {
        snprintf(out, len,
                 "%s and %s differ by no more than the noise on these %d prompts: %s − %s = %+.2f tokens per "
                 "round (%s [%+.2f, %+.2f] holds 0)",
                 b, a, p->n, b, a, p->diff, how, p->lo, p->hi);
    }
}

int eval_output_loops(const int32_t *ids, int n) {
    for (int p = 1; p <= EVAL_LOOP_MAX_PERIOD && 3 * p <= n; p++) {
        int r = 0; /* trailing positions that repeat the one p before */
        while (r < n - p && ids[n - 1 - r] == ids[n - 1 - r - p]) r++;
        if (r + p >= 3 * p && r + p >= EVAL_LOOP_MIN_TOKENS) return p;
    }
    return 0;
}
