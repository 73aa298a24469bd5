/* The largest entry of each token's row of a product, without the product's full float32 cost
 * where that pays (kn_matmul_argmax in dfl/kernels.h).
 *
 * On the AMX and AVX-512 BF16 paths a float32 activation is three bf16 parts, so from 6 tokens on
 * a product costs two or three tile products per weight tile (three VDPBF16PS) where bf16
 * activations cost one; the float32 FMA path (AVX-512) takes two FMAs per VDPBF16PS's 32
 * multiply-adds. A greedy verification reads only each row's argmax. So: estimate every entry
 * with the activations rounded to bf16 once, bound each estimate's distance from the float32
 * result (below), and compute the float32 result only for the rows whose bound reaches the best
 * lower bound, with the same kernel as the full product, so that those values are the full
 * product's bits. The argmax among them (first on ties) is then the argmax of the full row.
 * Measured on a 2-core AMD EPYC (AVX-512, bench target, bench/README.md): verify(16) 13-14%
 * and a 64-node tree 14-19% faster.
 *
 * The bound, for row r (weights w, Euclidean norm N_r) and token x (h: x rounded to bf16, as the
 * tiles round it; K columns; u = 2^-24; g = (K + 64) u / (1 - (K + 64) u)):
 *   |estimate - w.h| <= g N_r |h|        (a float32 sum of K exact products, any order)
 *   |w.h - w.x|      <= N_r |x - h|      (Cauchy-Schwarz)
 *   |w.x - result|   <= N_r (g 1.02 |x| + 2^-23 |x| + 3u |x|)   (each of the three parts' sums,
 *                       the parts' remainder below 2^-24 |x|, the two adds that join them)
 * plus the flushes of values under 2^-126 (the tiles treat them as zero): an absolute term and
 * 2^-122 sqrt(K) N_r. Every term is taken 1% larger. Where a bound cannot hold (weights or
 * activations not finite, a product that could overflow) or too many rows are close, the full
 * product runs instead. */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/safetensors.h"
#include "kn_internal.h"

#define CAND_MAX 64 /* rows a token may leave to the exact product before the full product runs */

struct kn_row_norms {
    _Atomic(float *) norm; /* [rows + 1]: each row's norm rounded up; [rows]: the largest, +inf if any is not finite */
};

kn_row_norms *kn_row_norms_new(void) { return calloc(1, sizeof(kn_row_norms)); }

void kn_row_norms_free(kn_row_norms *c) {
    if (!c) return;
    free(atomic_load(&c->norm));
    free(c);
}

static float round_up(double v) { return nextafterf((float)v, INFINITY); }

/* An upper bound on the norm of a BF16 row: the squares summed in float32 in 16 lanes (which
 * the compiler vectorizes), the lanes in double, then raised by the float32 sums' error bound. */
static float row_norm(const uint16_t *row, int cols) {
    float acc[16] = {0};
    for (int k = 0; k + 16 <= cols; k += 16)
        for (int j = 0; j < 16; j++) {
            const float v = st_bf16_to_f32(row[k + j]);
            acc[j] += v * v;
        }
    double sum = 0;
    for (int k = cols / 16 * 16; k < cols; k++) sum += (double)st_bf16_to_f32(row[k]) * st_bf16_to_f32(row[k]);
    for (int j = 0; j < 16; j++) sum += acc[j];
    const double g = (cols / 16 + 2) * 0x1p-24;
    return round_up(sqrt(sum * (1 + 2 * g / (1 - g))));
}

/* Each row's norm of BF16 w, once per cache (any thread may be first; one result is kept). */
static const float *row_norms(kn_row_norms *c, const dfl_mat *w) {
    float *p = atomic_load_explicit(&c->norm, memory_order_acquire);
    if (p) return p;
    const int rows = w->rows, cols = w->cols;
    p = malloc(((size_t)rows + 1) * sizeof(float));
    if (!p) return NULL;
    const uint16_t *d = w->data;
    float mx = 0;
    int bad = 0;
#pragma omp parallel for num_threads(kn_team((size_t)rows *cols)) schedule(dynamic, 256) reduction(max   \
                                                                                                   : mx) \
    reduction(|                                                                                          \
              : bad)
    for (int r = 0; r < rows; r++) {
        p[r] = row_norm(d + (size_t)r * cols, cols);
        if (!isfinite(p[r])) bad = 1;
        if (p[r] > mx) mx = p[r];
    }
    p[rows] = bad ? INFINITY : mx;
    float *none = NULL;
    if (!atomic_compare_exchange_strong_explicit(&c->norm, &none, p, memory_order_acq_rel, memory_order_acquire)) {
        free(p);
        p = none;
    }
    return p;
}

void kn_row_norms_prepare(kn_row_norms *c, const dfl_mat *w, int n) {
    if (c && kn_argmax_estimates(w, n)) row_norms(c, w);
}

/* v rounded to bf16 as VCVTNE2PS2BF16 rounds it: to nearest even, subnormals to zero (the
 * AVX-512 BF16 kernel keeps subnormals: the bound's 2^-122 term covers either). */
static float bf16_rne(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if ((b & 0x7f800000u) == 0) b &= 0x80000000u;
    else b = (b + 0x7fffu + (b >> 16 & 1)) & 0xffff0000u;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* |estimate - result| <= N_r e + a for every row r of one token (the file's comment). */
typedef struct tok_bound {
    double e, a, norm;
} tok_bound;

static tok_bound token_bound(const float *x, int K) {
    double x2 = 0, d2 = 0, h2 = 0;
    for (int k = 0; k < K; k++) {
        const double v = x[k], h = bf16_rne(x[k]);
        x2 += v * v, d2 += (v - h) * (v - h), h2 += h * h;
    }
    const double u = 0x1p-24, gk = (K + 64) * u, g = gk / (1 - gk), X = sqrt(x2), H = sqrt(h2), rk = sqrt((double)K);
    const double e = sqrt(d2) + g * (H + 1.02 * X) + (0x1p-23 + 3 * u) * X + 0x1p-122 * rk;
    const double a = 0x1p-120 * (rk * (X + H) + 4.0 * K + 64);
    return (tok_bound){.e = 1.01 * e, .a = 1.01 * a, .norm = X};
}

/* The rows whose float32 value may be the largest of y's (estimates of one token), in order;
 * -1 where more than cap. */
static int candidates(const float *y, int V, const float *nrm, tok_bound b, int32_t *out, int cap) {
    const int r0 = kn_argmax(y, V);
    const double lo = (double)y[r0] - nrm[r0] * b.e - b.a; /* the largest value is at least this */
    const double t = lo - nrm[V] * b.e - b.a;              /* every candidate's estimate reaches t */
    float tf = (float)t;
    if ((double)tf >= t) tf = nextafterf(tf, -INFINITY); /* so that "> tf" keeps every estimate >= t */
    int c = 0;
    for (int i = kn_first_above(y, V, tf); i < V; i += 1 + kn_first_above(y + i + 1, V - i - 1, tf)) {
        if ((double)y[i] + nrm[i] * b.e + b.a < lo) continue;
        if (c == cap) return -1;
        out[c++] = i;
    }
    return c;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The float32 values of rows rows[0..m-1] (ascending) of w for n tokens into yc [n][m], by the
 * kernel the full product runs them through: rows under the last multiple of 16 as a gathered
 * matrix of whole row tiles (padded with its first row), the others as one of under 16 rows. */
static int exact_rows(float *yc, const float *x, const dfl_mat *w, int n, const int32_t *rows, int m) {
    const int K = w->cols, r16 = w->rows / 16 * 16;
    int lo = 0;
    while (lo < m && rows[lo] < r16) lo++;
    const int pads[2] = {(lo + 15) / 16 * 16, m - lo}, offs[2] = {0, lo};
    for (int part = 0; part < 2; part++) {
        const int cnt = part ? m - lo : lo, pr = pads[part];
        if (!cnt) continue;
        uint16_t *g = malloc((size_t)pr * K * sizeof(uint16_t));
        float *yg = malloc((size_t)n * pr * sizeof(float));
        if (!g || !yg) {
            free(g), free(yg);
            return DFL_ERR;
        }
        for (int i = 0; i < pr; i++)
            memcpy(g + (size_t)i * K, (const uint16_t *)w->data + (size_t)rows[offs[part] + (i < cnt ? i : 0)] * K,
                   (size_t)K * sizeof(uint16_t));
        const dfl_mat gm = {.dtype = ST_BF16, .data = g, .rows = pr, .cols = K};
        kn_matmul(yg, x, &gm, n);
        for (int t = 0; t < n; t++)
            memcpy(yc + (size_t)t * m + offs[part], yg + (size_t)t * pr, (size_t)cnt * sizeof(float));
        free(g), free(yg);
    }
    return DFL_OK;
}

kn_estimate kn_argmax_estimate_kind(void) {
#if KN_X86
    if (kn_act_get() != KN_ACT_F32) return KN_EST_NONE; /* bf16 activations: one part already */
    const kn_isa isa = kn_isa_get();
#if defined(__linux__)
    if (isa == KN_ISA_AMX) return KN_EST_TILES;
#endif
    /* (off Linux KN_ISA_AMX runs the AVX-512 kernels, without the estimate) */
    if ((isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AVX512) && kn_isa_supported(KN_ISA_AVX512BF16)) return KN_EST_DP;
#endif
    return KN_EST_NONE;
}

int kn_argmax_estimates(const dfl_mat *w, int n) {
    return kn_argmax_estimate_kind() != KN_EST_NONE && w->dtype == ST_BF16 && w->cols % 32 == 0 && w->rows >= 16 &&
           n >= KN_ARGMAX_MIN_TOKENS;
}

#if KN_X86
/* Every entry with the activations rounded to bf16 once: the bf16-activation kernel of the path. */
static void estimate(float *y, const float *x, const dfl_mat *w, int n) {
#if defined(__linux__)
    if (kn_argmax_estimate_kind() == KN_EST_TILES) {
        kn_matmul_amx_bf16(y, x, w, n);
        return;
    }
#endif
    kn_matmul_bf16act(1, &(kn_mm_job){y, x, w, n});
}
#endif

/* The estimate route; DFL_ERR where it cannot vouch for its answer (y then holds nothing useful). */
static int argmax_estimated(int32_t *ids, float *y, const float *x, const dfl_mat *w, int n, kn_row_norms *rn) {
#if KN_X86
    const int V = w->rows, K = w->cols;
    const float *nrm = row_norms(rn, w);
    if (!nrm || !isfinite(nrm[V])) return DFL_ERR;
    tok_bound *b = malloc((size_t)n * sizeof *b);
    int32_t *cand = malloc((size_t)n * CAND_MAX * sizeof *cand), *all = malloc((size_t)n * CAND_MAX * sizeof *all);
    int *cnt = malloc((size_t)n * sizeof *cnt);
    float *yc = NULL;
    int rc = b && cand && all && cnt ? DFL_OK : DFL_ERR;
    for (int t = 0; t < n && rc == DFL_OK; t++) {
        b[t] = token_bound(x + (size_t)t * K, K);
        if (!(b[t].norm * nrm[V] < 1e37)) rc = DFL_ERR; /* not finite, or could overflow */
    }
    if (rc == DFL_OK) {
        estimate(y, x, w, n);
#pragma omp parallel for num_threads(kn_team((size_t)n *V)) schedule(dynamic, 1)
        for (int t = 0; t < n; t++)
            cnt[t] = candidates(y + (size_t)t * V, V, nrm, b[t], cand + (size_t)t * CAND_MAX, CAND_MAX);
    }
    int m = 0;
    for (int t = 0; t < n && rc == DFL_OK; t++) {
        if (cnt[t] < 0) rc = DFL_ERR;
        else memcpy(all + m, cand + (size_t)t * CAND_MAX, (size_t)cnt[t] * sizeof *all), m += cnt[t];
    }
    if (rc == DFL_OK) {
        qsort(all, (size_t)m, sizeof *all, cmp_i32);
        int u = 0;
        for (int i = 0; i < m; i++)
            if (!u || all[i] != all[u - 1]) all[u++] = all[i];
        m = u;
        yc = malloc((size_t)n * m * sizeof *yc);
        rc = yc ? exact_rows(yc, x, w, n, all, m) : DFL_ERR;
    }
    for (int t = 0; t < n && rc == DFL_OK; t++) { /* each token's candidates, ascending: first on ties */
        int best = -1;
        float bv = 0;
        for (int i = 0; i < cnt[t]; i++) {
            const int32_t r = cand[(size_t)t * CAND_MAX + i];
            const int32_t *at = bsearch(&r, all, (size_t)m, sizeof *all, cmp_i32);
            const float v = yc[(size_t)t * m + (at - all)];
            if (best < 0 || v > bv) best = r, bv = v;
        }
        ids[t] = best;
    }
    free(b), free(cand), free(all), free(cnt), free(yc);
    return rc;
#else
    (void)ids, (void)y, (void)x, (void)w, (void)n, (void)rn;
    return DFL_ERR;
#endif
}

int kn_matmul_argmax(int32_t *ids, float *y, const float *x, const dfl_mat *w, int n, kn_row_norms *rn) {
    if (n < 1) return 1;
    const double t0 = KN_PROF_BEGIN(); /* one call in the profile, whichever route answers */
    const int full = !(rn && kn_argmax_estimates(w, n) && argmax_estimated(ids, y, x, w, n, rn) == DFL_OK);
    if (full) {
        kn_matmul(y, x, w, n);
        for (int t = 0; t < n; t++) ids[t] = kn_argmax(y + (size_t)t * w->rows, w->rows);
    }
    KN_PROF_END(KN_OP_MATMUL, t0, (uint64_t)w->rows * w->cols * st_dtype_size(w->dtype));
    return full;
}
