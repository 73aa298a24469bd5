/* Generic C kernels (float32 compute over F32/F16/BF16/F8_E4M3 weights), OpenMP-threaded, and
 * the dispatch of the kernels that have SIMD variants. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "kn_internal.h"

void kn_mat_row(const dfl_mat *w, int row, float *out) {
    size_t off = (size_t)row * (size_t)w->cols;
    int n = w->cols;
    switch (w->dtype) {
    case ST_F32:
        memcpy(out, (const float *)w->data + off, (size_t)n * sizeof(float));
        break;
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
    default:
        abort(); /* the loader refuses other dtypes before any compute */
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
#pragma omp parallel for schedule(static) if ((size_t)rows * cols * n >= KN_PAR_MIN_WORK)
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < n; t++) y[(size_t)t * rows + r] = dot_row(w, r, x + (size_t)t * cols);
}

void kn_matmul_multi(int count, float *const *y, const float *x, const dfl_mat *const *w, int n) {
    if (count < 1) return;
#if KN_X86
    const kn_isa isa = kn_isa_get();
    const kn_act act = kn_act_get();
#if defined(__linux__)
    if (isa == KN_ISA_AMX && act == KN_ACT_F32) {
        kn_matmul_amx_multi(count, y, x, w, n);
        return;
    }
#endif
    int same = count <= KN_MULTI_MAX; /* one dtype and width: one activation layout, one kernel */
    for (int i = 1; i < count && same; i++) same = w[i]->dtype == w[0]->dtype && w[i]->cols == w[0]->cols;
    if (!same) {
        for (int i = 0; i < count; i++) kn_matmul_multi(1, &y[i], x, &w[i], n);
        return;
    }
    const int bf16 = w[0]->dtype == ST_BF16;
    if (bf16 && act == KN_ACT_BF16) { /* kn_act_set checked the CPU */
        kn_matmul_bf16act(count, y, x, w, n);
        return;
    }
    switch (isa) {
    case KN_ISA_AMX: /* (with bf16 activations, or off Linux) */
    case KN_ISA_AVX512BF16:
        if (bf16) kn_matmul_avx512bf16(count, y, x, w, n);
        else kn_matmul_avx512(count, y, x, w, n);
        return;
    case KN_ISA_AVX512:
        kn_matmul_avx512(count, y, x, w, n);
        return;
    case KN_ISA_AVX2:
        kn_matmul_avx2(count, y, x, w, n);
        return;
    default:
        break;
    }
#endif
    for (int i = 0; i < count; i++) kn_matmul_generic(y[i], x, w[i], n);
}

void kn_matmul(float *y, const float *x, const dfl_mat *w, int n) { kn_matmul_multi(1, &y, x, &w, n); }

float kn_dot(const float *a, const float *b, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512:
        return kn_dot_avx512(a, b, n);
    case KN_ISA_AVX2:
        return kn_dot_avx2(a, b, n);
#endif
    default:
        return kn_dot_generic(a, b, n);
    }
}

void kn_axpy(float *y, float a, const float *x, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512:
        kn_axpy_avx512(y, a, x, n);
        return;
    case KN_ISA_AVX2:
        kn_axpy_avx2(y, a, x, n);
        return;
#endif
    default:
        kn_axpy_generic(y, a, x, n);
    }
}

void kn_dot_rows_generic(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m,
                         int n) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < m; j++) out[(size_t)g * ldo + j] = kn_dot_generic(a + (size_t)g * lda, b + (size_t)j * ldb, n);
}

void kn_axpy_rows_generic(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m,
                          int n) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < m; j++) {
            const float wj = w[(size_t)g * ldw + j];
            if (wj != 0.0f) kn_axpy_generic(y + (size_t)g * ldy, wj, x + (size_t)j * ldx, n);
        }
}

void kn_dot_rows(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512:
        kn_dot_rows_avx512(out, ldo, a, lda, G, b, ldb, m, n);
        return;
    case KN_ISA_AVX2:
        kn_dot_rows_avx2(out, ldo, a, lda, G, b, ldb, m, n);
        return;
#endif
    default:
        kn_dot_rows_generic(out, ldo, a, lda, G, b, ldb, m, n);
    }
}

void kn_axpy_rows(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512:
        kn_axpy_rows_avx512(y, ldy, w, ldw, G, x, ldx, m, n);
        return;
    case KN_ISA_AVX2:
        kn_axpy_rows_avx2(y, ldy, w, ldw, G, x, ldx, m, n);
        return;
#endif
    default:
        kn_axpy_rows_generic(y, ldy, w, ldw, G, x, ldx, m, n);
    }
}

void kn_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

void kn_swiglu(float *a, const float *b, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512:
        kn_swiglu_avx512(a, b, n);
        return;
    case KN_ISA_AVX2:
        kn_swiglu_avx2(a, b, n);
        return;
#endif
    default:
        for (int i = 0; i < n; i++) a[i] = kn_silu(a[i]) * b[i];
    }
}

void kn_silu_inplace(float *x, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512:
        kn_silu_inplace_avx512(x, n);
        return;
    case KN_ISA_AVX2:
        kn_silu_inplace_avx2(x, n);
        return;
#endif
    default:
        for (int i = 0; i < n; i++) x[i] = kn_silu(x[i]);
    }
}

void kn_conv_silu(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512:
        kn_conv_silu_avx512(x, ld, n, nc, K, wt, win);
        return;
    case KN_ISA_AVX2:
        kn_conv_silu_avx2(x, ld, n, nc, K, wt, win);
        return;
#endif
    default:
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
}

void kn_rope(float *x, const float *cos, const float *sin, int rot) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

void kn_softmax(float *x, int n) {
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

size_t kn_count_nonfinite(const float *x, size_t n) {
    size_t bad = 0;
    /* a verification's logits (16 x 248320 values) take ~2.7 ms on one thread: 3% of it */
#pragma omp parallel for simd schedule(static) reduction(+ : bad) if (n >= KN_PAR_MIN_WORK)
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

int kn_argmax(const float *x, int n) {
#if KN_X86
    const kn_isa isa = kn_isa_get();
    if (isa == KN_ISA_AVX512 || isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AMX) return kn_argmax_avx512(x, n);
#endif
    return kn_argmax_generic(x, n);
}

double kn_peak_macs(long iters, const char **what) {
    volatile float sink = 0;
    double per = 1; /* multiply-adds of the matmul per instruction */
    const double t0 = dfl_now();
#if KN_X86
    const kn_isa isa = kn_isa_get();
    if (kn_act_get() == KN_ACT_BF16) {
        *what = "VDPBF16PS zmm", per = 32, sink = kn_peak_dp512(iters);
    } else if (isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AMX) { /* three bf16 parts per activation */
        *what = "VDPBF16PS zmm, activations in 3 bf16 parts", per = 32.0 / 3, sink = kn_peak_dp512(iters);
    } else if (isa == KN_ISA_AVX512) {
        *what = "FMA zmm (float32)", per = 16, sink = kn_peak_fma512(iters);
    } else if (isa == KN_ISA_AVX2) {
        *what = "FMA ymm (float32)", per = 8, sink = kn_peak_fma256(iters);
    } else
#endif
    {
        float a[12];
        for (int c = 0; c < 12; c++) a[c] = 0.01f * c;
        for (long k = 0; k < iters; k++)
            for (int c = 0; c < 12; c++) a[c] = fmaf(a[c], 0.999f, 1e-3f);
        for (int c = 0; c < 12; c++) sink += a[c];
        *what = "scalar fmaf (float32)";
    }
    (void)sink;
    return 12.0 * per * (double)iters / (dfl_now() - t0);
}

