/* The forwards' row-wise and elementwise ops (dfl/kernels.h): norms, rotary tables, residual
 * adds, gates. Each output element is computed by one fixed sequence of operations, so the
 * threading (OpenMP over rows or chunks claimed dynamically, serial below KN_PAR_MIN_WORK)
 * changes no bit. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "kn_internal.h"

#define SUMSQ_GROUP 8 /* vectors whose sums of squares run side by side */

/* The sums of squares of R <= SUMSQ_GROUP vectors v[r][0..d-1], each one float sum in index order
 * (the bits of a plain loop over one vector): a group's chains interleave, so that
 * each add waits on its own vector's previous add only, not on every add before it. */
static void sumsq(const float *const *v, int R, int d, float *ss) {
    if (R == SUMSQ_GROUP) { /* eight named sums: they stay in registers */
        const float *a = v[0], *b = v[1], *c = v[2], *e = v[3], *f = v[4], *g = v[5], *h = v[6], *k = v[7];
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        for (int i = 0; i < d; i++) {
            s0 += a[i] * a[i], s1 += b[i] * b[i], s2 += c[i] * c[i], s3 += e[i] * e[i];
            s4 += f[i] * f[i], s5 += g[i] * g[i], s6 += h[i] * h[i], s7 += k[i] * k[i];
        }
        ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3, ss[4] = s4, ss[5] = s5, ss[6] = s6, ss[7] = s7;
        return;
    }
    for (int r = 0; r < R; r++) {
        float s = 0;
        for (int i = 0; i < d; i++) s += v[r][i] * v[r][i];
        ss[r] = s;
    }
}

/* RMS norm of R <= SUMSQ_GROUP vectors x[r] into y[r] (in place allowed): each row the same bits
 * whatever R (kn_rmsnorm is one row). */
static void rmsnorm_group(float *const *y, const float *const *x, const float *w, int R, int dim, float eps) {
    float ss[SUMSQ_GROUP];
    sumsq(x, R, dim, ss);
    for (int r = 0; r < R; r++) {
        const float rs = 1.0f / sqrtf(ss[r] / (float)dim + eps);
        float *yr = y[r];
        const float *xr = x[r];
#pragma omp simd /* elementwise (y may be x): no dependence between elements */
        for (int i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * rs);
    }
}

void kn_rmsnorm(float *y, const float *x, const float *w, int n, float eps) { rmsnorm_group(&y, &x, w, 1, n, eps); }

void kn_rmsnorm_rows(float *y, const float *x, const float *w, int rows, int dim, float eps) {
    const double prof_t0 = KN_PROF_BEGIN();
    const size_t work = (size_t)rows * dim * 4;
    const int groups = (rows + SUMSQ_GROUP - 1) / SUMSQ_GROUP;
#pragma omp parallel for num_threads(kn_team(work)) schedule(dynamic, kn_chunk(groups)) if (work >= KN_PAR_MIN_WORK)
    for (int g = 0; g < groups; g++) {
        const int r0 = g * SUMSQ_GROUP, R = rows - r0 < SUMSQ_GROUP ? rows - r0 : SUMSQ_GROUP;
        float *yr[SUMSQ_GROUP];
        const float *xr[SUMSQ_GROUP];
        for (int r = 0; r < R; r++) yr[r] = y + (size_t)(r0 + r) * dim, xr[r] = x + (size_t)(r0 + r) * dim;
        rmsnorm_group(yr, xr, w, R, dim, eps);
    }
    KN_PROF_END(KN_OP_ELEMENT, prof_t0, 0);
}

#define EW_CHUNK 4096 /* elements per work item (a multiple of any vector width: same tails as one call) */

void kn_swiglu_par(float *a, const float *b, size_t n) {
    const double prof_t0 = KN_PROF_BEGIN();
    const long chunks = (long)((n + EW_CHUNK - 1) / EW_CHUNK);
    const size_t work = n * 8;
#pragma omp parallel for num_threads(kn_team(work)) schedule(dynamic, kn_chunk(chunks)) if (work >= KN_PAR_MIN_WORK)
    for (long c = 0; c < chunks; c++) {
        const size_t i0 = (size_t)c * EW_CHUNK;
        kn_swiglu(a + i0, b + i0, (int)(n - i0 < EW_CHUNK ? n - i0 : EW_CHUNK));
    }
    KN_PROF_END(KN_OP_ELEMENT, prof_t0, 0);
}

void kn_add(float *x, const float *y, size_t n) {
    const double prof_t0 = KN_PROF_BEGIN();
    const long chunks = (long)((n + EW_CHUNK - 1) / EW_CHUNK);
    const size_t work = n * 4;
#pragma omp parallel for num_threads(kn_team(work)) schedule(dynamic, kn_chunk(chunks)) if (work >= KN_PAR_MIN_WORK)
    for (long c = 0; c < chunks; c++) {
        const size_t i1 = (size_t)(c + 1) * EW_CHUNK < n ? (size_t)(c + 1) * EW_CHUNK : n;
        for (size_t i = (size_t)c * EW_CHUNK; i < i1; i++) x[i] += y[i];
    }
    KN_PROF_END(KN_OP_ELEMENT, prof_t0, 0);
}

void kn_add_scaled(float *x, float a, const float *y, int n) {
    const double prof_t0 = KN_PROF_BEGIN();
    for (int i = 0; i < n; i++) x[i] += a * y[i];
    KN_PROF_END(KN_OP_ELEMENT, prof_t0, 0);
}

void kn_scale(float *x, float a, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= a;
}

void kn_softcap(float *x, float cap, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
}

void kn_rope_table(float *cos, float *sin, const float *inv_freq, int half, float pos) {
    const double prof_t0 = KN_PROF_BEGIN();
    for (int i = 0; i < half; i++) {
        const float f = pos * inv_freq[i];
        cos[i] = cosf(f), sin[i] = sinf(f);
    }
    KN_PROF_END(KN_OP_ATTENTION, prof_t0, 0);
}

void kn_head_norm_rope(float *x, int nh, size_t ldh, const float *w, int hd, float eps, const float *cos,
                       const float *sin, int rot) {
    const double prof_t0 = KN_PROF_BEGIN();
    for (int h0 = 0; h0 < nh; h0 += SUMSQ_GROUP) {
        const int R = nh - h0 < SUMSQ_GROUP ? nh - h0 : SUMSQ_GROUP;
        float *v[SUMSQ_GROUP];
        for (int r = 0; r < R; r++) v[r] = x + (size_t)(h0 + r) * ldh;
        rmsnorm_group(v, (const float *const *)v, w, R, hd, eps);
        for (int r = 0; r < R; r++) kn_rope(v[r], cos, sin, rot);
    }
    KN_PROF_END(KN_OP_ATTENTION, prof_t0, 0);
}

void kn_l2norm_heads(float *x, size_t ld, int n, int nh, int d, float scale) {
    const double prof_t0 = KN_PROF_BEGIN();
    /* threaded from the size at which the forward's joint q and k loop was */
    const size_t work = (size_t)n * nh * d * 4;
#pragma omp parallel for num_threads(kn_team(work)) \
    schedule(dynamic, kn_chunk(((long)n * nh + SUMSQ_GROUP - 1) / SUMSQ_GROUP)) if (work >= KN_PAR_MIN_WORK)
    for (int th0 = 0; th0 < n * nh; th0 += SUMSQ_GROUP) { /* (token, head) vectors, a group at a time */
        const int R = n * nh - th0 < SUMSQ_GROUP ? n * nh - th0 : SUMSQ_GROUP;
        float *v[SUMSQ_GROUP], ss[SUMSQ_GROUP];
        for (int r = 0; r < R; r++) v[r] = x + (size_t)((th0 + r) / nh) * ld + (size_t)((th0 + r) % nh) * d; /* [d] */
        sumsq((const float *const *)v, R, d, ss);
        for (int r = 0; r < R; r++) {
            const float rs = 1.0f / sqrtf(ss[r] + 1e-6f);
            float *vr = v[r];
#pragma omp simd
            for (int i = 0; i < d; i++) vr[i] = vr[i] * rs * scale;
        }
    }
    KN_PROF_END(KN_OP_CONV, prof_t0, 0);
}

void kn_gather_sum(float *out, const float *y, const int *rows, const float *w, int n, int k, int H) {
    const double prof_t0 = KN_PROF_BEGIN();
    const size_t work = (size_t)n * k * H;
#pragma omp parallel for num_threads(kn_team(work)) schedule(dynamic, kn_chunk(n)) if (work >= KN_PAR_MIN_WORK)
    for (int t = 0; t < n; t++) {
        float *o = out + (size_t)t * H; /* [H] */
        memset(o, 0, (size_t)H * sizeof(float));
        for (int j = 0; j < k; j++) kn_add_scaled(o, w[(size_t)t * k + j], y + (size_t)rows[(size_t)t * k + j] * H, H);
    }
    KN_PROF_END(KN_OP_ELEMENT, prof_t0, 0);
}

void kn_gdn_gates(float *gb, const float *ab, int Hv, int h, int t0, int nt, const float *neg_exp_A,
                  const float *dt_bias) {
    for (int t = 0; t < nt; t++) {
        const float a = ab[(size_t)(t0 + t) * 2 * Hv + h], b = ab[(size_t)(t0 + t) * 2 * Hv + Hv + h];
        gb[t] = neg_exp_A[h] * kn_softplus(a + dt_bias[h]);
        gb[KN_GDN_CHUNK + t] = kn_sigmoid(b);
    }
}

/* Tree node t's window rows (oldest first) into w [K-1]: its K-1 nearest ancestors' inputs in
 * xin, the newest of the committed state's before the root. */
static void conv_node_rows(const float **w, const float *state, const float *xin, const int *parent, int t, int C,
                           int K) {
    int j = K - 2, a = parent[t];
    for (; j >= 0 && a >= 0; j--, a = parent[a]) w[j] = xin + (size_t)a * C;
    for (int s = K - 2; j >= 0; j--, s--) w[j] = state + (size_t)s * C;
}

void kn_conv_window(float *win, const float *state, const float *xin, const int *path, int len, int C, int K) {
    const double prof_t0 = KN_PROF_BEGIN();
    const size_t row = (size_t)C * sizeof(float);
    for (int j = 0; j < K - 1; j++) {    /* oldest first: row j reads a later state row, so win may be state */
        const int k = j - (K - 1 - len); /* the path's k-th input, or state row j + len before it */
        memmove(win + (size_t)j * C, k >= 0 ? xin + (size_t)path[k] * C : state + (size_t)(j + len) * C, row);
    }
    KN_PROF_END(KN_OP_CONV, prof_t0, 0);
}

/* The weights of the 16 channels at c0 as kn_conv_silu takes them: wt [K][16], zero past nc. */
static void conv_group_weights(float *wt, const float *w, int c0, int nc, int K) {
    memset(wt, 0, (size_t)K * 16 * sizeof(float));
    for (int j = 0; j < K; j++)
        for (int i = 0; i < nc; i++) wt[j * 16 + i] = w[(size_t)(c0 + i) * K + j];
}

/* A tree: every node's inputs kept in xin first (nodes read their ancestors' inputs, and outputs
 * overwrite x), then node by node over all channels, each window read in place from its rows
 * (node-major: a node's rows are read and written once, in order). */
static int conv_tree(float *x, int n, int C, int K, const float *w, const float *state, const int *parent, float *xin) {
    const int groups = (C + 15) / 16;
    const float **src = malloc((size_t)n * (K > 1 ? K - 1 : 1) * sizeof *src);
    float *wt = malloc((size_t)groups * K * 16 * sizeof(float)); /* [group][K][16] */
    if (!src || !wt) {
        free(src), free(wt);
        return DFL_ERR;
    }
    for (int t = 0; t < n; t++) conv_node_rows(src + (size_t)t * (K - 1), state, xin, parent, t, C, K);
    for (int g = 0; g < groups; g++)
        conv_group_weights(wt + (size_t)g * K * 16, w, 16 * g, C - 16 * g < 16 ? C - 16 * g : 16, K);
    const size_t work = (size_t)n * C * (K + 8);
#pragma omp parallel num_threads(kn_team(work)) if (work >= KN_PAR_MIN_WORK)
    {
#pragma omp for schedule(dynamic, kn_chunk(n))
        for (int t = 0; t < n; t++) memcpy(xin + (size_t)t * C, x + (size_t)t * C, (size_t)C * sizeof(float));
#pragma omp for schedule(dynamic, kn_chunk(n)) /* after every input is kept (the loop's barrier) */
        for (int t = 0; t < n; t++)
            kn_conv_silu_rows(x + (size_t)t * C, (size_t)C, 1, C, K, wt, src + (size_t)t * (K - 1));
    }
    free(src), free(wt);
    return DFL_OK;
}

void kn_causal_conv_silu(float *x, int n, int C, int K, const float *w, float *state, const int *parent, float *xin) {
    const double prof_t0 = KN_PROF_BEGIN();
    if (parent && conv_tree(x, n, C, K, w, state, parent, xin) == DFL_OK) {
        KN_PROF_END(KN_OP_CONV, prof_t0, 0);
        return;
    }
    /* a chain (or a tree without memory for its row lists): 16 channels at a time (the
     * kn_conv_silu width), the window in registers, each token's row read and written once */
    const size_t work = (size_t)n * C * (K + 8);
#pragma omp parallel for num_threads(kn_team(work)) \
    schedule(dynamic, kn_chunk((C + 15) / 16)) if (work >= KN_PAR_MIN_WORK)
    for (int c0 = 0; c0 < C; c0 += 16) {
        const int nc = C - c0 < 16 ? C - c0 : 16;
        const size_t row_bytes = (size_t)nc * sizeof(float);
        float win[15][16] = {{0}}, wt[16][16]; /* [tap][channel]: window (oldest first), weights */
        conv_group_weights(wt[0], w, c0, nc, K);
        if (!parent) {
            for (int j = 0; j < K - 1; j++) memcpy(win[j], state + (size_t)j * C + c0, row_bytes);
            kn_conv_silu(x + c0, (size_t)C, n, nc, K, wt[0], win[0]);
            for (int j = 0; j < K - 1; j++) memcpy(state + (size_t)j * C + c0, win[j], row_bytes);
            continue;
        }
        for (int t = 0; t < n; t++) /* the inputs, before the outputs overwrite them */
            memcpy(xin + (size_t)t * C + c0, x + (size_t)t * C + c0, row_bytes);
        for (int t = 0; t < n; t++) { /* each node continues its ancestors' inputs */
            const float *rows[15];
            conv_node_rows(rows, state, xin, parent, t, C, K);
            for (int j = 0; j < K - 1; j++) rows[j] += c0;
            kn_conv_silu_rows(x + (size_t)t * C + c0, (size_t)C, 1, nc, K, wt[0], rows);
        }
    }
    KN_PROF_END(KN_OP_CONV, prof_t0, 0);
}

/* The k largest by repeated scans (the lower id wins ties), summed in the order taken, as
 * transformers does in float32; listed by id, the order the experts' outputs are added in. */
void kn_moe_route(float *p, int E, int k, int norm, int *idx, float *w) {
    const double prof_t0 = KN_PROF_BEGIN();
    kn_softmax(p, E);
    float sum = 0;
    for (int j = 0; j < k; j++) {
        int best = 0;
        for (int e = 1; e < E; e++)
            if (p[e] > p[best]) best = e;
        idx[j] = best, w[j] = p[best];
        sum += p[best];
        p[best] = -1.0f; /* taken: probabilities are >= 0 */
    }
    if (norm)
        for (int j = 0; j < k; j++) w[j] /= sum;
    for (int j = 1; j < k; j++) /* insertion sort by expert id */
        for (int i = j; i > 0 && idx[i - 1] > idx[i]; i--) {
            const int ti = idx[i];
            const float tw = w[i];
            idx[i] = idx[i - 1], w[i] = w[i - 1];
            idx[i - 1] = ti, w[i - 1] = tw;
        }
    KN_PROF_END(KN_OP_ELEMENT, prof_t0, 0);
}

void kn_conv_grouped(float *y, const float *x, const float *base, const float *delta, size_t ldd, int B, int H, int T,
                     int gs) {
    const int G = H / gs;
    for (int i = 0; i < B; i++) {
        const float *di = delta + (size_t)i * ldd; /* [T, G] of row i */
        float *yi = y + (size_t)i * H;
        memset(yi, 0, (size_t)H * sizeof(float));
        for (int t = 0; t <= i && t < T; t++) {
            const float *xt = x + (size_t)(i - t) * H, *bt = base + (size_t)t * H;
            for (int c = 0; c < H; c++) yi[c] += (bt[c] + di[t * G + c / gs]) * xt[c];
        }
    }
}

void kn_topk_values(const float *row, int V, int K, int32_t *ids, float *vals) {
    int n = 0;
    for (int v = 0; v < V; v++) {
        const float x = row[v];
        if (n == K && !(x > vals[K - 1])) continue;
        int j = n < K ? n++ : K - 1;
        while (j > 0 && x > vals[j - 1]) {
            vals[j] = vals[j - 1], ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = x, ids[j] = v;
    }
}

void kn_mul(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] *= y[i];
}

void kn_fill(float *x, float v, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}

double kn_logsoftmax_top(const float *row, int V, int k, int32_t *ids, float *lp) {
    float mx = row[0];
    for (int i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    const double lse = mx + log(sum);
    /* the k largest, kept sorted (most probable first; a later id never displaces an equal one) */
    int n = 0;
    for (int i = 0; i < V && k > 0; i++) {
        if (n == k && row[i] <= row[ids[k - 1]]) continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && row[ids[at - 1]] < row[i]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = i;
    }
    for (int i = 0; i < n; i++) lp[i] = (float)(row[ids[i]] - lse);
    return lse;
}
