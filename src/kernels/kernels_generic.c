/* Generic C kernels: float32 compute over F32/F16/BF16/F8_E4M3 weights, OpenMP-threaded where
 * the work pays for it. The portable path of every dispatched kernel (kernels.c), and the kernels
 * that have no SIMD variant. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "kn_internal.h"

void kn_mat_row(const dfl_mat *w, int row, float *out) {
    size_t off = (size_t)row * (size_t)w->cols;
    int n = w->cols;
    switch (w->dtype) {
    case ST_F32: memcpy(out, (const float *)w->data + off, (size_t)n * sizeof(float)); break;
    case ST_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + off;
        for (int i = 0; i < n; i++) out[i] = st_bf16_to_f32(p[i]);
        break;
    }
    case ST_F16: {
        const uint16_t *p = (const uint16_t *)w->data + off;
        for (int i = 0; i < n; i++) out[i] = st_f16_to_f32(p[i]);
        break;
    }
    case ST_F8_E4M3: {
        const uint8_t *p = (const uint8_t *)w->data + off;
        const float *s = kn_f8_scale_row(w, row);
        for (int i = 0; i < n; i++) out[i] = st_f8e4m3_to_f32(p[i]) * s[i / w->bcol];
        break;
    }
    default: abort(); /* the loader refuses other dtypes before any compute */
    }
}

float kn_dot_generic(const float *a, const float *b, int n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

void kn_axpy_generic(float *y, float a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* One (row, token) product of the generic kernel: the row converted on the fly, four
 * interleaved partial sums (the same order as kn_dot_generic). */
static float dot_row(const dfl_mat *w, int row, const float *x) {
    const size_t off = (size_t)row * (size_t)w->cols;
    const int n = w->cols;
    if (w->dtype == ST_F32) return kn_dot_generic((const float *)w->data + off, x, n);
    if (w->dtype == ST_F8_E4M3) { /* each weight dequantized, block by block; sums as above */
        const uint8_t *p = (const uint8_t *)w->data + off;
        const float *sc = kn_f8_scale_row(w, row);
        float s[4] = {0, 0, 0, 0};
        for (int c0 = 0; c0 < n; c0 += w->bcol) {
            const float m = sc[c0 / w->bcol];
            const int c1 = c0 + w->bcol < n ? c0 + w->bcol : n;
            for (int i = c0; i < c1; i++) s[i & 3] += st_f8e4m3_to_f32(p[i]) * m * x[i];
        }
        return (s[0] + s[1]) + (s[2] + s[3]);
    }
    const uint16_t *p = (const uint16_t *)w->data + off;
    const int bf = w->dtype == ST_BF16;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (bf ? st_bf16_to_f32(p[i]) : st_f16_to_f32(p[i])) * x[i];
        s1 += (bf ? st_bf16_to_f32(p[i + 1]) : st_f16_to_f32(p[i + 1])) * x[i + 1];
        s2 += (bf ? st_bf16_to_f32(p[i + 2]) : st_f16_to_f32(p[i + 2])) * x[i + 2];
        s3 += (bf ? st_bf16_to_f32(p[i + 3]) : st_f16_to_f32(p[i + 3])) * x[i + 3];
    }
    for (; i < n; i++) s0 += (bf ? st_bf16_to_f32(p[i]) : st_f16_to_f32(p[i])) * x[i];
    return (s0 + s1) + (s2 + s3);
}

void kn_matmul_generic(float *y, const float *x, const dfl_mat *w, int n) {
    const int rows = w->rows, cols = w->cols;
    if (w->dtype != ST_F32 && w->dtype != ST_BF16 && w->dtype != ST_F16 && w->dtype != ST_F8_E4M3)
        abort(); /* the loader refuses other dtypes before any compute */
    const size_t work = (size_t)rows * cols * n;
#pragma omp parallel for num_threads(kn_team(work)) schedule(dynamic, kn_chunk(rows)) if (work >= KN_PAR_MIN_WORK)
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < n; t++) y[(size_t)t * rows + r] = dot_row(w, r, x + (size_t)t * cols);
}

void kn_dot_rows_generic(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m,
                         int n) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < m; j++)
            out[(size_t)g * ldo + j] = kn_dot_generic(a + (size_t)g * lda, b + (size_t)j * ldb, n);
}

void kn_axpy_rows_generic(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m,
                          int n) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < m; j++) {
            const float wj = w[(size_t)g * ldw + j];
            if (wj != 0.0f) kn_axpy_generic(y + (size_t)g * ldy, wj, x + (size_t)j * ldx, n);
        }
}

void kn_rope(float *x, const float *cos, const float *sin, int rot) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

void kn_softmax_generic(float *x, int n) {
    float m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    float s = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

int kn_first_above_generic(const float *x, int n, float t) {
    for (int i = 0; i < n; i++)
        if (x[i] > t) return i;
    return n;
}

size_t kn_count_nonfinite_generic(const float *x, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        bad += (b & 0x7f800000u) == 0x7f800000u;
    }
    return bad;
}

int kn_argmax_generic(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void kn_swiglu_generic(float *a, const float *b, int n) {
    for (int i = 0; i < n; i++) a[i] = kn_silu(a[i]) * b[i];
}

void kn_silu_inplace_generic(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = kn_silu(x[i]);
}

void kn_conv_silu_generic(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win) {
    for (int t = 0; t < n; t++) {
        float *row = x + (size_t)t * ld;
        for (int i = 0; i < nc; i++) {
            const float raw = row[i];
            float acc = wt[(K - 1) * 16 + i] * raw;
            for (int j = 0; j < K - 1; j++) acc += wt[j * 16 + i] * win[j * 16 + i];
            for (int j = 0; j + 1 < K - 1; j++) win[j * 16 + i] = win[(j + 1) * 16 + i];
            if (K > 1) win[(K - 2) * 16 + i] = raw;
            row[i] = kn_silu(acc);
        }
    }
}
