/* AVX-512 softmax whose results equal kn_softmax_generic's bit for bit (the drafts' summaries,
 * attention and routing stay what they were), and the scan that top-K selections skip with.
 *
 * The generic softmax calls libm's expf for every value and sums the results in index order. Here
 * expf runs 16 values at a time through the algorithm of glibc's expf (2.27 and later, the build
 * it selects on FMA machines): x/ln2 split into k/32 + r by a rounding shift, 2^(k/32) from a
 * 32-entry table of doubles, a degree-3 polynomial in r, all in double with the same fused
 * operations, rounded to float once. Its constants are glibc's, so the values are the same bits;
 * a self-check against the libm this process runs compares a sweep of inputs once, and any
 * difference (another libm) sends every call to the generic kernel. Values outside (-88, 88),
 * where glibc has special cases, take libm's expf itself. The sum stays a float sum in index
 * order: that order is part of the result. */
#include "kn_internal.h"

#if KN_X86
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define TGT_AVX512 __attribute__((target("avx2,fma,avx512f")))
#define INLINE static inline __attribute__((always_inline))

/* 2^(i/32) rounded to double, minus i in the exponent field's lowest bits shifted by 47: adding
 * k << 47 for k = 32 e + i then gives 2^e 2^(i/32) in one integer add. */
#define T(i, b) ((b) - ((uint64_t)(i) << 47))
static const uint64_t exp2_tab[32] = {
    T(0, 0x3ff0000000000000ull),  T(1, 0x3ff059b0d3158574ull),  T(2, 0x3ff0b5586cf9890full),
    T(3, 0x3ff11301d0125b51ull),  T(4, 0x3ff172b83c7d517bull),  T(5, 0x3ff1d4873168b9aaull),
    T(6, 0x3ff2387a6e756238ull),  T(7, 0x3ff29e9df51fdee1ull),  T(8, 0x3ff306fe0a31b715ull),
    T(9, 0x3ff371a7373aa9cbull),  T(10, 0x3ff3dea64c123422ull), T(11, 0x3ff44e086061892dull),
    T(12, 0x3ff4bfdad5362a27ull), T(13, 0x3ff5342b569d4f82ull), T(14, 0x3ff5ab07dd485429ull),
    T(15, 0x3ff6247eb03a5585ull), T(16, 0x3ff6a09e667f3bcdull), T(17, 0x3ff71f75e8ec5f74ull),
    T(18, 0x3ff7a11473eb0187ull), T(19, 0x3ff82589994cce13ull), T(20, 0x3ff8ace5422aa0dbull),
    T(21, 0x3ff93737b0cdc5e5ull), T(22, 0x3ff9c49182a3f090ull), T(23, 0x3ffa5503b23e255dull),
    T(24, 0x3ffae89f995ad3adull), T(25, 0x3ffb7f76f2fb5e47ull), T(26, 0x3ffc199bdd85529cull),
    T(27, 0x3ffcb720dcef9069ull), T(28, 0x3ffd5818dcfba487ull), T(29, 0x3ffdfc97337b9b5full),
    T(30, 0x3ffea4afa2a490daull), T(31, 0x3fff50765b6e4540ull),
};
#undef T
#define INV_LN2_32 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define SHIFT 0x1.8p+52                 /* adding it rounds to an integer, kept in the low bits */
#define C0 0x1.c6af84b912394p-20        /* 2^(r/32) ~ 1 + r (C2 + r (C1 + r C0)), |r| <= 1/2 */
#define C1 0x1.ebfce50fac4f3p-13
#define C2 0x1.62e42ff0c52d6p-6

/* expf of 8 values in (-88, 88), as glibc computes each. */
TGT_AVX512 INLINE __m256 expf8(__m256 x) {
    const __m512d xd = _mm512_cvtps_pd(x), inv = _mm512_set1_pd(INV_LN2_32), shift = _mm512_set1_pd(SHIFT);
    __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    __m512i t = _mm512_i64gather_epi64(_mm512_and_si512(ki, _mm512_set1_epi64(31)), exp2_tab, 8);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(C0), _mm512_set1_pd(C1));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(C2), _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

/* y = expf(x) for 16 values: the vector form where every one is inside (-88, 88) (glibc's fast
 * path: exponent field at most 0x42a), else libm. */
TGT_AVX512 INLINE void expf16(float *y, const float *x) {
    const __m512 v = _mm512_loadu_ps(x);
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 20), _mm512_set1_epi32(0x7ff));
    if (_mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a))) {
        for (int j = 0; j < 16; j++) y[j] = expf(x[j]);
        return;
    }
    _mm256_storeu_ps(y, expf8(_mm512_castps512_ps256(v)));
    _mm256_storeu_ps(y + 8, expf8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

TGT_AVX512 void kn_expf_avx512(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) expf16(y + i, x + i);
    for (; i < n; i++) y[i] = expf(x[i]);
}

/* The vector expf against this process's libm over every 4099th float of (-88, 88) and the
 * edges of the fast path; 1 when all are the same bits. */
static int exact;
static void check_exact(void) {
    enum { N = 4096 };
    float x[N], a[N];
    int ok = 1;
    uint32_t b = 0;
    while (ok && b < 0x42b00000u) {
        int n = 0;
        for (; n < N && b < 0x42b00000u; n++, b += 4099u) {
            const uint32_t u = n % 2 ? b | 0x80000000u : b; /* both signs */
            memcpy(&x[n], &u, sizeof u);
        }
        kn_expf_avx512(a, x, n);
        for (int i = 0; i < n && ok; i++) ok = memcmp(&a[i], &(float){expf(x[i])}, sizeof(float)) == 0;
    }
    exact = ok;
}

int kn_softmax_avx512_exact(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, check_exact);
    return exact;
}

/* kn_softmax_generic's result: the same maximum, the same expf values summed in the same order,
 * the same scaling. */
TGT_AVX512 void kn_softmax_avx512(float *x, int n) {
    float m = x[0];
    int i = 1;
    if (n >= 17) { /* lanes keep their first maximum; NaNs never replace one (as `x > m ? x : m`) */
        __m512 mv = _mm512_set1_ps(m);
        for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(_mm512_loadu_ps(x + i), mv);
        const float l = _mm512_reduce_max_ps(mv); /* only finite lanes here, or all NaN from x[0] */
        m = l > m ? l : m;
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    const __m512 mv = _mm512_set1_ps(m);
    float s = 0;
    i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(x + i, _mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        expf16(x + i, x + i);
        for (int j = 0; j < 16; j++) s += x[i + j];
    }
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    const float inv = 1.0f / s;
    const __m512 iv = _mm512_set1_ps(inv);
    for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), iv));
    for (; i < n; i++) x[i] *= inv;
}

TGT_AVX512 int kn_first_above_avx512(const float *x, int n, float t) {
    const __m512 tv = _mm512_set1_ps(t);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), tv, _CMP_GT_OQ);
        if (k) return i + __builtin_ctz(k);
    }
    for (; i < n; i++)
        if (x[i] > t) return i;
    return n;
}

#endif
