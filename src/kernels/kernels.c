/* The dispatch of the kernels that have SIMD variants: each public kn_* picks the variant of the
 * current instruction-set path (the generic C ones are in kernels_generic.c). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "kn_internal.h"

/* The AMX path (either activation mode): products go through kn_matmul_amx_multi. */
static int mm_amx(void) {
#if KN_X86 && defined(__linux__)
    return kn_isa_get() == KN_ISA_AMX;
#else
    return 0;
#endif
}

/* count jobs of one dtype and width through the current path's kernel (not the AMX one). */
static void mm_uniform(int count, const kn_mm_job *j) {
#if KN_X86
    const int bf16 = j[0].w->dtype == ST_BF16;
    if (bf16 && kn_act_get() == KN_ACT_BF16) { /* kn_act_set checked the CPU */
        kn_matmul_bf16act(count, j);
        return;
    }
    switch (kn_isa_get()) {
    case KN_ISA_AMX: /* (off Linux) */
    case KN_ISA_AVX512BF16:
        if (bf16) kn_matmul_avx512bf16(count, j);
        else kn_matmul_avx512(count, j);
        return;
    case KN_ISA_AVX512: kn_matmul_avx512(count, j); return;
    case KN_ISA_AVX2: kn_matmul_avx2(count, j); return;
    default: break;
    }
#endif
    for (int i = 0; i < count; i++) kn_matmul_generic(j[i].y, j[i].x, j[i].w, j[i].n);
}

static void matmul_jobs(int count, const kn_mm_job *j) {
    for (int i = 0, e; i < count; i = e) {
        e = i + 1;
#if KN_X86 && defined(__linux__)
        if (mm_amx()) { /* runs of one batch size and width in one region, each product with its input */
            while (e < count && e - i < KN_AMX_JOBS_MAX && j[e].n == j[i].n && j[e].w->cols == j[i].w->cols) e++;
            float *y[KN_AMX_JOBS_MAX];
            const float *x[KN_AMX_JOBS_MAX];
            const dfl_mat *w[KN_AMX_JOBS_MAX];
            for (int q = i; q < e; q++) y[q - i] = j[q].y, x[q - i] = j[q].x, w[q - i] = j[q].w;
            if (j[i].n > 0) kn_matmul_amx_multi(e - i, y, x, w, j[i].n);
            continue;
        }
#endif
        /* runs of one dtype and width: one activation layout, one kernel */
        while (e < count && j[e].w->dtype == j[i].w->dtype && j[e].w->cols == j[i].w->cols) e++;
        mm_uniform(e - i, j + i);
    }
}

static void matmul_multi(int count, float *const *y, const float *x, const dfl_mat *const *w, int n) {
    if (count < 1) return;
#if KN_X86 && defined(__linux__)
    if (mm_amx() && count <= KN_AMX_JOBS_MAX) {
        const float *xs[KN_AMX_JOBS_MAX];
        for (int i = 0; i < count; i++) xs[i] = x;
        kn_matmul_amx_multi(count, y, xs, w, n);
        return;
    }
#endif
    enum { MAX = 8 };
    if (count > MAX) { /* one at a time */
        for (int i = 0; i < count; i++) kn_matmul_multi(1, &y[i], x, &w[i], n);
        return;
    }
    kn_mm_job j[MAX];
    for (int i = 0; i < count; i++) j[i] = (kn_mm_job){y[i], x, w[i], n};
    kn_matmul_jobs(count, j);
}

/* Weight bytes of a product (the op profile). */
static uint64_t mat_bytes(const dfl_mat *w) { return (uint64_t)w->rows * w->cols * st_dtype_size(w->dtype); }

void kn_matmul_jobs(int count, const kn_mm_job *j) {
    const double t0 = KN_PROF_BEGIN();
    matmul_jobs(count, j);
    uint64_t b = 0;
    for (int i = 0; t0 >= 0 && i < count; i++) b += mat_bytes(j[i].w);
    KN_PROF_END(KN_OP_MATMUL, t0, b);
}

void kn_matmul_multi(int count, float *const *y, const float *x, const dfl_mat *const *w, int n) {
    const double t0 = KN_PROF_BEGIN();
    matmul_multi(count, y, x, w, n);
    uint64_t b = 0;
    for (int i = 0; t0 >= 0 && i < count; i++) b += mat_bytes(w[i]);
    KN_PROF_END(KN_OP_MATMUL, t0, b);
}

void kn_matmul(float *y, const float *x, const dfl_mat *w, int n) { kn_matmul_jobs(1, &(kn_mm_job){y, x, w, n}); }

float kn_dot(const float *a, const float *b, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512: return kn_dot_avx512(a, b, n);
    case KN_ISA_AVX2: return kn_dot_avx2(a, b, n);
#endif
    default: return kn_dot_generic(a, b, n);
    }
}

void kn_axpy(float *y, float a, const float *x, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512: kn_axpy_avx512(y, a, x, n); return;
    case KN_ISA_AVX2: kn_axpy_avx2(y, a, x, n); return;
#endif
    default: kn_axpy_generic(y, a, x, n);
    }
}

void kn_dot_rows(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512: kn_dot_rows_avx512(out, ldo, a, lda, G, b, ldb, m, n); return;
    case KN_ISA_AVX2: kn_dot_rows_avx2(out, ldo, a, lda, G, b, ldb, m, n); return;
#endif
    default: kn_dot_rows_generic(out, ldo, a, lda, G, b, ldb, m, n);
    }
}

void kn_axpy_rows(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512: kn_axpy_rows_avx512(y, ldy, w, ldw, G, x, ldx, m, n); return;
    case KN_ISA_AVX2: kn_axpy_rows_avx2(y, ldy, w, ldw, G, x, ldx, m, n); return;
#endif
    default: kn_axpy_rows_generic(y, ldy, w, ldw, G, x, ldx, m, n);
    }
}

void kn_swiglu(float *a, const float *b, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512: kn_swiglu_avx512(a, b, n); return;
    case KN_ISA_AVX2: kn_swiglu_avx2(a, b, n); return;
#endif
    default: kn_swiglu_generic(a, b, n);
    }
}

void kn_silu_inplace(float *x, int n) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512: kn_silu_inplace_avx512(x, n); return;
    case KN_ISA_AVX2: kn_silu_inplace_avx2(x, n); return;
#endif
    default: kn_silu_inplace_generic(x, n);
    }
}

#if KN_X86
/* The paths with AVX-512 F (row scans, the per-token convolution). */
static int isa_avx512(void) {
    const kn_isa isa = kn_isa_get();
    return isa == KN_ISA_AVX512 || isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AMX;
}
#endif

void kn_conv_silu_rows(float *x, size_t ld, int n, int C, int K, const float *wt, const float *const *src) {
#if KN_X86
    if (isa_avx512()) {
        kn_conv_silu_rows_avx512(x, ld, n, C, K, wt, src);
        return;
    }
#endif
    for (int t = 0; t < n; t++) /* each token's window gathered, then the one-token kernel */
        for (int c0 = 0; c0 < C; c0 += 16) {
            const int nc = C - c0 < 16 ? C - c0 : 16;
            float win[15][16] = {{0}};
            for (int j = 0; j < K - 1; j++)
                memcpy(win[j], src[(size_t)t * (K - 1) + j] + c0, (size_t)nc * sizeof(float));
            kn_conv_silu(x + (size_t)t * ld + c0, ld, 1, nc, K, wt + (size_t)c0 * K, win[0]);
        }
}

void kn_conv_silu(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win) {
    switch (kn_isa_get()) {
#if KN_X86
    case KN_ISA_AMX:
    case KN_ISA_AVX512BF16:
    case KN_ISA_AVX512: kn_conv_silu_avx512(x, ld, n, nc, K, wt, win); return;
    case KN_ISA_AVX2: kn_conv_silu_avx2(x, ld, n, nc, K, wt, win); return;
#endif
    default: kn_conv_silu_generic(x, ld, n, nc, K, wt, win);
    }
}

void kn_softmax(float *x, int n) {
#if KN_X86
    if (isa_avx512() && kn_softmax_avx512_exact()) {
        kn_softmax_avx512(x, n);
        return;
    }
#endif
    kn_softmax_generic(x, n);
}

int kn_first_above(const float *x, int n, float t) {
#if KN_X86
    if (isa_avx512()) return kn_first_above_avx512(x, n, t);
#endif
    return kn_first_above_generic(x, n, t);
}

size_t kn_count_nonfinite(const float *x, size_t n) {
    const double prof_t0 = KN_PROF_BEGIN();
    enum { CHUNK = 1 << 15 }; /* floats a work item */
    const long chunks = (long)((n + CHUNK - 1) / CHUNK);
    size_t bad = 0;
    /* a 16-token verification's logits (16 x 248320): 1.4 ms on 2 threads in the compiler's SSE2
     * loop, 0.94 ms in AVX-512 (AMX host, 2026-12-05) */
#pragma omp parallel for num_threads(kn_team(n)) schedule(dynamic, kn_chunk(chunks)) reduction(+ : bad) if (n >= KN_PAR_MIN_WORK)
    for (long c = 0; c < chunks; c++) {
        const size_t i0 = (size_t)c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
#if KN_X86
        bad += isa_avx512() ? kn_count_nonfinite_avx512(x + i0, len) : kn_count_nonfinite_generic(x + i0, len);
#else
        bad += kn_count_nonfinite_generic(x + i0, len);
#endif
    }
    KN_PROF_END(KN_OP_LOGITS, prof_t0, 0);
    return bad;
}

int kn_argmax(const float *x, int n) {
    const double t0 = KN_PROF_BEGIN();
#if KN_X86
    const int i = isa_avx512() ? kn_argmax_avx512(x, n) : kn_argmax_generic(x, n);
#else
    const int i = kn_argmax_generic(x, n);
#endif
    KN_PROF_END(KN_OP_LOGITS, t0, 0);
    return i;
}

double kn_peak_macs_loaded(long iters, const char **what) {
    *what = NULL;
#if KN_X86 && defined(__linux__)
    if (kn_isa_get() == KN_ISA_AMX) {
        const long calls = iters / 16 > 0 ? iters / 16 : 1; /* 192 instructions a call: about 12 x iters */
        const double per = 16 * 16 * 32 / (kn_act_get() == KN_ACT_BF16 ? 1.0 : 3.0), t0 = dfl_now();
        const float sink = kn_peak_amx_loaded(calls); /* a positive sum; 0: no memory for the tiles */
        if (!(sink > 0)) return 0;
        *what = "TDPBF16PS tiles, a weight tile and six B tiles loaded a step, the B tiles from L2";
        return 192.0 * per * (double)calls / (dfl_now() - t0);
    }
#endif
    (void)iters;
    return 0;
}

double kn_peak_macs_estimate(long iters, const char **what) {
    volatile float sink = 0;
    double per = 0;
    *what = NULL;
    const double t0 = dfl_now();
    switch (kn_argmax_estimate_kind()) {
#if KN_X86 && defined(__linux__)
    case KN_EST_TILES:
        *what = "TDPBF16PS tiles, activations as one bf16 part", per = 16 * 16 * 32, sink = kn_peak_amx(iters);
        break;
#endif
#if KN_X86
    case KN_EST_DP: *what = "VDPBF16PS zmm, activations as one bf16 part", per = 32, sink = kn_peak_dp512(iters); break;
#endif
    default: return 0;
    }
    (void)sink;
    return 12.0 * per * (double)iters / (dfl_now() - t0);
}

double kn_peak_macs(long iters, const char **what) {
    volatile float sink = 0;
    double per = 1; /* multiply-adds of the matmul per instruction */
    const double t0 = dfl_now();
#if KN_X86
    const kn_isa isa = kn_isa_get();
#if defined(__linux__)
    if (isa == KN_ISA_AMX) { /* kn_matmul_amx_multi's instruction; each activation in 1 or 3 parts */
        const int bf16 = kn_act_get() == KN_ACT_BF16;
        *what = bf16 ? "TDPBF16PS tiles, bf16 activations" : "TDPBF16PS tiles, activations in 3 bf16 parts";
        per = 16 * 16 * 32 / (bf16 ? 1.0 : 3.0), sink = kn_peak_amx(iters);
    } else if (kn_act_get() == KN_ACT_BF16) {
#else
    if (kn_act_get() == KN_ACT_BF16) {
#endif
        *what = "VDPBF16PS zmm", per = 32, sink = kn_peak_dp512(iters);
    } else if (isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AMX) { /* three bf16 parts per activation (AMX: off Linux) */
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
