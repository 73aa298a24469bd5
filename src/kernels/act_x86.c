/* x86-64 SIMD variants of the SiLU kernels (kn_silu_inplace, kn_swiglu, kn_conv_silu): a vectorized exp
 * (Cephes-style: e^x = 2^k e^r, |r| <= ln2/2, degree-7 polynomial, ~2 ulp), tails through
 * masked lanes so that an element's result never depends on where it sits in the array. */
#include "kn_internal.h"

#if KN_X86
#include <immintrin.h>

#define TGT_AVX2 __attribute__((target("avx2,fma")))
#define TGT_AVX512 __attribute__((target("avx2,fma,avx512f")))
#define INLINE static inline __attribute__((always_inline))

/* exp(x) polynomial on the reduced argument r: 1 + r + r^2 (1/2 + r (1/6 + ...)). */
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
#define LOG2E 1.44269504088896341f

TGT_AVX512 INLINE __m512 exp_512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, k);
}

TGT_AVX512 INLINE __m512 silu_512(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

TGT_AVX512 void kn_silu_inplace_avx512(float *x, int n) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, silu_512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

TGT_AVX512 void kn_swiglu_avx512(float *a, const float *b, int n) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 s = silu_512(_mm512_maskz_loadu_ps(m, a + i));
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, b + i)));
    }
}

/* The convolution window stays in registers; KW is a constant for the common kernel width (4),
 * so that the loops over taps unroll. */
TGT_AVX512 INLINE void conv_silu_512(float *x, size_t ld, int n, __mmask16 m, const float *wt, float *win,
                                     const int KW) {
    __m512 w[16], h[16];
    for (int j = 0; j < KW; j++) w[j] = _mm512_loadu_ps(wt + j * 16);
    for (int j = 0; j < KW - 1; j++) h[j] = _mm512_loadu_ps(win + j * 16);
    for (int t = 0; t < n; t++) {
        float *row = x + (size_t)t * ld;
        const __m512 raw = _mm512_maskz_loadu_ps(m, row);
        __m512 acc = _mm512_mul_ps(w[KW - 1], raw);
        for (int j = 0; j < KW - 1; j++) acc = _mm512_fmadd_ps(w[j], h[j], acc);
        for (int j = 0; j + 1 < KW - 1; j++) h[j] = h[j + 1];
        if (KW > 1) h[KW - 2] = raw;
        _mm512_mask_storeu_ps(row, m, silu_512(acc));
    }
    for (int j = 0; j < KW - 1; j++) _mm512_storeu_ps(win + j * 16, h[j]);
}

TGT_AVX512 void kn_conv_silu_avx512(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win) {
    const __mmask16 m = (__mmask16)((1u << nc) - 1);
    if (K == 4) conv_silu_512(x, ld, n, m, wt, win, 4);
    else conv_silu_512(x, ld, n, m, wt, win, K);
}

/* conv_silu_512 of one token and 16 channels at a time, its window loaded from its own rows
 * (masked: lanes past C read as zero, as a gathered window's would). */
TGT_AVX512 INLINE void conv_silu_rows_512(float *x, size_t ld, int n, int C, const float *wt, const float *const *src,
                                          const int KW) {
    for (int t = 0; t < n; t++) {
        float *row = x + (size_t)t * ld;
        const float *const *s = src + (size_t)t * (KW - 1);
        for (int c0 = 0; c0 < C; c0 += 16) {
            const __mmask16 m = C - c0 >= 16 ? 0xffff : (__mmask16)((1u << (C - c0)) - 1);
            const float *w = wt + (size_t)c0 * KW; /* this group's [KW][16] */
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(w + (KW - 1) * 16), _mm512_maskz_loadu_ps(m, row + c0));
            for (int j = 0; j < KW - 1; j++)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(w + j * 16), _mm512_maskz_loadu_ps(m, s[j] + c0), acc);
            _mm512_mask_storeu_ps(row + c0, m, silu_512(acc));
        }
    }
}

TGT_AVX512 void kn_conv_silu_rows_avx512(float *x, size_t ld, int n, int C, int K, const float *wt,
                                         const float *const *src) {
    if (K == 4) conv_silu_rows_512(x, ld, n, C, wt, src, 4);
    else conv_silu_rows_512(x, ld, n, C, wt, src, K);
}

/* AVX2: 2^k by the exponent bits, so k stays in [-126, 127]. */
TGT_AVX2 INLINE __m256 exp_256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 k =
        _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

TGT_AVX2 INLINE __m256 silu_256(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* Lanes < k set. */
TGT_AVX2 INLINE __m256i lanes8(int k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

TGT_AVX2 void kn_silu_inplace_avx2(float *x, int n) {
    for (int i = 0; i < n; i += 8) {
        const __m256i m = lanes8(n - i);
        _mm256_maskstore_ps(x + i, m, silu_256(_mm256_maskload_ps(x + i, m)));
    }
}

/* Two 8-channel halves, each as conv_silu_512. */
TGT_AVX2 INLINE void conv_silu_256(float *x, size_t ld, int n, __m256i m, const float *wt, float *win, const int KW) {
    __m256 w[16], h[16];
    for (int j = 0; j < KW; j++) w[j] = _mm256_loadu_ps(wt + j * 16);
    for (int j = 0; j < KW - 1; j++) h[j] = _mm256_loadu_ps(win + j * 16);
    for (int t = 0; t < n; t++) {
        float *row = x + (size_t)t * ld;
        const __m256 raw = _mm256_maskload_ps(row, m);
        __m256 acc = _mm256_mul_ps(w[KW - 1], raw);
        for (int j = 0; j < KW - 1; j++) acc = _mm256_fmadd_ps(w[j], h[j], acc);
        for (int j = 0; j + 1 < KW - 1; j++) h[j] = h[j + 1];
        if (KW > 1) h[KW - 2] = raw;
        _mm256_maskstore_ps(row, m, silu_256(acc));
    }
    for (int j = 0; j < KW - 1; j++) _mm256_storeu_ps(win + j * 16, h[j]);
}

TGT_AVX2 void kn_conv_silu_avx2(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win) {
    for (int half = 0; half < 2 && 8 * half < nc; half++) {
        const __m256i m = lanes8(nc - 8 * half);
        if (K == 4) conv_silu_256(x + 8 * half, ld, n, m, wt + 8 * half, win + 8 * half, 4);
        else conv_silu_256(x + 8 * half, ld, n, m, wt + 8 * half, win + 8 * half, K);
    }
}

TGT_AVX2 void kn_swiglu_avx2(float *a, const float *b, int n) {
    for (int i = 0; i < n; i += 8) {
        const __m256i m = lanes8(n - i);
        const __m256 s = silu_256(_mm256_maskload_ps(a + i, m));
        _mm256_maskstore_ps(a + i, m, _mm256_mul_ps(s, _mm256_maskload_ps(b + i, m)));
    }
}
#endif
