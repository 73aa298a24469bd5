/* Every op of the CUDA backend (src/backend/cuda/cuda_ops.h) against a reference on the host on
 * random shapes, in the manner of llama.cpp's test-backend-ops: the CPU kernels where dfl has
 * one (kn_rmsnorm, kn_rope, kn_conv_silu, kn_gdn_recurrent, kn_argmax), float64 sums elsewhere.
 * And the exactness properties the backend promises, bit for bit: a token's output does not
 * depend on how many tokens share the call, and a tree node equals the same token in a chain.
 * Label "gpu": exits 77 (skipped) where no GPU answers. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/kernels.h"
#include "dfl/safetensors.h"
#include "testutil.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static void *dput(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc %zu failed\n", bytes);
        exit(1);
    }
    if (h) cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    else cudaMemset(d, 0, bytes ? bytes : 4);
    return d;
}
static void dget(void *h, const void *d, size_t bytes) {
    const cudaError_t e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
        exit(1);
    }
}

/* max |a - b| / max(|b|, floor) over n values */
static double relerr(const float *a, const float *b, size_t n, double floor) {
    double e = 0, m = floor;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d; /* NaN counts */
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return e / m;
}

/* ---- matmul -------------------------------------------------------------------------------- */

static uint16_t f16_bits(float f) { /* exact for the values made below: |f| in [2^-4, 4), 10-bit mantissa */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t s = (u >> 16) & 0x8000, e = ((u >> 23) & 0xff) - 127 + 15, m = (u >> 13) & 0x3ff;
    return (uint16_t)(s | e << 10 | m);
}

static void test_matmul(cu_dtype dt, int rows, int cols) {
    const int N = 70;
    const size_t wn = (size_t)rows * cols;
    float *w = malloc(wn * sizeof(float)), *x = malloc((size_t)N * cols * sizeof(float));
    uint16_t *w16 = malloc(wn * sizeof(uint16_t));
    for (size_t i = 0; i < wn; i++) {
        float v = frand();
        if (dt == CU_BF16) v = st_bf16_to_f32(st_f32_to_bf16(v));
        if (dt == CU_F16) { /* a 10-bit mantissa and exponent in [-4, 1] */
            uint32_t u;
            memcpy(&u, &v, 4);
            u &= 0x807fe000u;
            u |= (uint32_t)(127 - 4 + (int)(rng % 6)) << 23;
            memcpy(&v, &u, 4);
            w16[i] = f16_bits(v);
        }
        if (dt == CU_BF16) w16[i] = st_f32_to_bf16(v);
        w[i] = v;
    }
    fill(x, (size_t)N * cols, 1.0f);
    void *dw = dput(dt == CU_F32 ? (const void *)w : (const void *)w16, wn * (dt == CU_F32 ? 4 : 2));
    const cu_mat W = {.dtype = dt, .w = dw, .rows = rows, .cols = cols};
    float *dx = dput(x, (size_t)N * cols * sizeof(float)), *dy = dput(NULL, (size_t)N * rows * sizeof(float));
    float *y = malloc((size_t)N * rows * sizeof(float)), *y1 = malloc((size_t)rows * sizeof(float));
    cu_matmul(dy, dx, &W, N);
    dget(y, dy, (size_t)N * rows * sizeof(float));
    double worst = 0;
    for (int t = 0; t < N; t++)
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int c = 0; c < cols; c++)
                ref += (double)w[(size_t)r * cols + c] * x[(size_t)t * cols + c],
                    mag += fabs((double)w[(size_t)r * cols + c] * x[(size_t)t * cols + c]);
            const double e = fabs(y[(size_t)t * rows + r] - ref) / (mag > 0 ? mag : 1);
            if (!(e <= worst)) worst = e;
        }
    /* float32 accumulation; on the tensor cores (BF16) three bf16 parts of each activation */
    CHECK(worst < 3e-5, "matmul dtype %d [%d, %d] x %d tokens: error %.3g of sum |w x|", dt, rows, cols, N, worst);
    printf("matmul dtype %d [%d, %d] x %d: worst error %.3g of sum |w x|\n", dt, rows, cols, N, worst);
    /* batch invariance: each token alone, and in calls of 2..N tokens, gives the same bits */
    const int ns[] = {1, 2, 4, 5, 16, 17, 33, 65};
    int same = 1;
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        const int n = ns[k];
        for (int t0 = 0; t0 + n <= N; t0 += n) {
            cu_matmul(dy, dx + (size_t)t0 * cols, &W, n);
            for (int t = 0; t < n; t++) {
                dget(y1, dy + (size_t)t * rows, (size_t)rows * sizeof(float));
                same &= memcmp(y1, y + (size_t)(t0 + t) * rows, (size_t)rows * sizeof(float)) == 0;
            }
        }
    }
    CHECK(same, "matmul dtype %d [%d, %d]: a token's row depends on the tokens beside it", dt, rows, cols);
    cudaFree(dw), cudaFree(dx), cudaFree(dy);
    free(w), free(w16), free(x), free(y), free(y1);
}

/* ---- norms, elementwise, argmax --------------------------------------------------------------- */

static void test_norms(void) {
    const int dims[] = {32, 100, 256, 5120};
    for (size_t k = 0; k < sizeof dims / sizeof *dims; k++) {
        const int d = dims[k], rows = 5;
        float *x = malloc((size_t)rows * d * sizeof(float)), *w = malloc((size_t)d * sizeof(float));
        float *z = malloc((size_t)rows * d * sizeof(float));
        float *ref = malloc((size_t)rows * d * sizeof(float)), *got = malloc((size_t)rows * d * sizeof(float));
        fill(x, (size_t)rows * d, 3.0f), fill(w, (size_t)d, 1.5f), fill(z, (size_t)rows * d, 4.0f);
        float *dx = dput(x, (size_t)rows * d * 4), *dw = dput(w, (size_t)d * 4), *dy = dput(NULL, (size_t)rows * d * 4);
        float *dz = dput(z, (size_t)rows * d * 4);
        for (int r = 0; r < rows; r++) kn_rmsnorm(ref + (size_t)r * d, x + (size_t)r * d, w, d, 1e-6f);
        cu_rmsnorm(dy, dx, dw, rows, d, 1e-6f);
        dget(got, dy, (size_t)rows * d * 4);
        CHECK(relerr(got, ref, (size_t)rows * d, 1e-3) < 1e-5, "rmsnorm dim %d: %.3g", d,
              relerr(got, ref, (size_t)rows * d, 1e-3));
        /* gated: z = silu(z) * (w * norm(x)) */
        for (size_t i = 0; i < (size_t)rows * d; i++) ref[i] = kn_silu(z[i]) * ref[i];
        cu_gated_rmsnorm(dz, dx, dw, rows, d, 1e-6f);
        dget(got, dz, (size_t)rows * d * 4);
        CHECK(relerr(got, ref, (size_t)rows * d, 1e-3) < 1e-5, "gated rmsnorm dim %d: %.3g", d,
              relerr(got, ref, (size_t)rows * d, 1e-3));
        cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dz);
        free(x), free(w), free(z), free(ref), free(got);
    }
    const size_t n = 100003;
    float *a = malloc(n * 4), *b = malloc(n * 4), *ref = malloc(n * 4), *got = malloc(n * 4);
    fill(a, n, 6.0f), fill(b, n, 2.0f);
    float *da = dput(a, n * 4), *db = dput(b, n * 4);
    for (size_t i = 0; i < n; i++) ref[i] = kn_silu(a[i]) * b[i];
    cu_swiglu(da, db, n);
    dget(got, da, n * 4);
    CHECK(relerr(got, ref, n, 1e-3) < 1e-6, "swiglu: %.3g", relerr(got, ref, n, 1e-3));
    for (size_t i = 0; i < n; i++) ref[i] += b[i];
    cu_add(da, db, n);
    dget(got, da, n * 4);
    CHECK(relerr(got, ref, n, 1e-3) < 1e-6, "add: %.3g", relerr(got, ref, n, 1e-3));
    /* argmax: the first of equal maxima, as kn_argmax */
    const int V = 50000, R = 4;
    float *lg = malloc((size_t)R * V * 4);
    fill(lg, (size_t)R * V, 10.0f);
    lg[(size_t)1 * V + 777] = lg[(size_t)1 * V + 40000] = 50.0f; /* tie */
    lg[(size_t)2 * V + 0] = 60.0f;
    lg[(size_t)3 * V + V - 1] = 70.0f;
    float *dl = dput(lg, (size_t)R * V * 4);
    int32_t *dids = dput(NULL, R * 4), ids[4];
    unsigned *dbad = dput(NULL, 4), bad = 1;
    cu_argmax(dids, dl, R, V, dbad);
    dget(ids, dids, sizeof ids), dget(&bad, dbad, 4);
    for (int r = 0; r < R; r++)
        CHECK(ids[r] == kn_argmax(lg + (size_t)r * V, V), "argmax row %d: %d, kn_argmax %d", r, ids[r],
              kn_argmax(lg + (size_t)r * V, V));
    CHECK(bad == 0, "argmax counted %u non-finite values in finite rows", bad);
    lg[5] = NAN, lg[9] = INFINITY;
    cudaMemcpy(dl, lg, (size_t)R * V * 4, cudaMemcpyHostToDevice);
    cu_argmax(dids, dl, R, V, dbad);
    dget(&bad, dbad, 4);
    CHECK(bad == 2, "argmax: %u non-finite values counted, 2 planted", bad);
    cudaFree(da), cudaFree(db), cudaFree(dl), cudaFree(dids), cudaFree(dbad);
    free(a), free(b), free(ref), free(got), free(lg);
}

/* ---- attention: norms + rope + cache, then the attention op, chain and tree -------------------- */

static void test_attention(int gated) {
    const int Hq = 4, Hkv = 2, hd = 64, rot = 16, p0 = 11, n = 6, ldh = hd * (gated ? 2 : 1), ldq = Hq * ldh;
    const int kvw = Hkv * hd, slots = p0 + n, ldsc = 64;
    float *q = malloc((size_t)n * ldq * 4), *k = malloc((size_t)n * kvw * 4), *v = malloc((size_t)n * kvw * 4);
    float *kc = malloc((size_t)slots * kvw * 4), *vc = malloc((size_t)slots * kvw * 4);
    float qn[64], kn[64], inv[8];
    fill(q, (size_t)n * ldq, 2.0f), fill(k, (size_t)n * kvw, 2.0f), fill(v, (size_t)n * kvw, 1.0f);
    fill(kc, (size_t)slots * kvw, 1.0f), fill(vc, (size_t)slots * kvw, 1.0f), fill(qn, 64, 1.2f), fill(kn, 64, 1.2f);
    for (int i = 0; i < rot / 2; i++) inv[i] = 1.0f / powf(1e7f, (float)(2 * i) / (float)rot);
    int pos[6];
    for (int t = 0; t < n; t++) pos[t] = p0 + t;
    float *dq = dput(q, (size_t)n * ldq * 4), *dk = dput(k, (size_t)n * kvw * 4), *dv = dput(v, (size_t)n * kvw * 4);
    float *dkc = dput(kc, (size_t)slots * kvw * 4), *dvc = dput(vc, (size_t)slots * kvw * 4);
    float *dqn = dput(qn, 256), *dkn = dput(kn, 256), *dinv = dput(inv, 32);
    int *dpos = dput(pos, sizeof pos);
    cu_qk_norm_rope(dq, ldq, ldh, Hq, dk, dv, Hkv, hd, rot, dqn, dkn, 1e-6f, dpos, dinv, dkc, dvc, p0, n);
    /* reference: the CPU forward's per-head norm and rotation */
    for (int t = 0; t < n; t++) {
        float cs[8], sn[8];
        for (int i = 0; i < rot / 2; i++) cs[i] = cosf((float)pos[t] * inv[i]), sn[i] = sinf((float)pos[t] * inv[i]);
        for (int h = 0; h < Hq; h++) {
            float *qh = q + (size_t)t * ldq + (size_t)h * ldh;
            kn_rmsnorm(qh, qh, qn, hd, 1e-6f), kn_rope(qh, cs, sn, rot);
        }
        for (int h = 0; h < Hkv; h++) {
            float *kh = k + (size_t)t * kvw + (size_t)h * hd;
            kn_rmsnorm(kh, kh, kn, hd, 1e-6f), kn_rope(kh, cs, sn, rot);
        }
        memcpy(kc + (size_t)(p0 + t) * kvw, k + (size_t)t * kvw, (size_t)kvw * 4);
        memcpy(vc + (size_t)(p0 + t) * kvw, v + (size_t)t * kvw, (size_t)kvw * 4);
    }
    float *got = malloc((size_t)(slots * kvw > n * ldq ? slots * kvw : n * ldq) * 4);
    dget(got, dq, (size_t)n * ldq * 4);
    CHECK(relerr(got, q, (size_t)n * ldq, 1e-3) < 2e-6, "q norm + rope: %.3g", relerr(got, q, (size_t)n * ldq, 1e-3));
    dget(got, dkc, (size_t)slots * kvw * 4);
    CHECK(relerr(got, kc, (size_t)slots * kvw, 1e-3) < 2e-6, "k norm + rope into the cache: %.3g",
          relerr(got, kc, (size_t)slots * kvw, 1e-3));
    dget(got, dvc, (size_t)slots * kvw * 4);
    CHECK(memcmp(got, vc, (size_t)slots * kvw * 4) == 0, "values into the cache");
    /* the attention op, chain: token t sees rows 0 .. p0 + t */
    float *dout = dput(NULL, (size_t)n * Hq * hd * 4), *dsc = dput(NULL, (size_t)n * Hq * ldsc * 4);
    float *out = malloc((size_t)n * Hq * hd * 4), *ref = malloc((size_t)n * Hq * hd * 4);
    cu_attention(dout, dq, ldq, ldh, Hq, Hkv, hd, dkc, dvc, p0, NULL, 0, NULL, gated, dsc, ldsc, n);
    dget(out, dout, (size_t)n * Hq * hd * 4);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < Hq; h++) {
            const float *qh = q + (size_t)t * ldq + (size_t)h * ldh;
            const int kvh = h / (Hq / Hkv), len = p0 + t + 1;
            double s[64], mx = -1e300, sum = 0;
            for (int j = 0; j < len; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * kc[(size_t)j * kvw + (size_t)kvh * hd + i];
                s[j] = d / sqrt((double)hd), mx = s[j] > mx ? s[j] : mx;
            }
            for (int j = 0; j < len; j++) s[j] = exp(s[j] - mx), sum += s[j];
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < len; j++) o += s[j] / sum * vc[(size_t)j * kvw + (size_t)kvh * hd + i];
                if (gated) o *= 1.0 / (1.0 + exp(-(double)qh[hd + i]));
                ref[(size_t)t * Hq * hd + (size_t)h * hd + i] = (float)o;
            }
        }
    CHECK(relerr(out, ref, (size_t)n * Hq * hd, 1e-2) < 1e-5, "attention (gated %d): %.3g", gated,
          relerr(out, ref, (size_t)n * Hq * hd, 1e-2));
    /* tree: nodes {0, 1, 2, 3, 4, 5} with parents {-1, 0, 0, 1, 1, 3}; node 5's path 0, 1, 3, 5.
     * A chain whose rows p0.. hold that path's keys and values must give node 5's output bit for bit
     * at its token 3 (queries equal). */
    const int parent[6] = {-1, 0, 0, 1, 1, 3}, depth[6] = {0, 1, 1, 2, 2, 3};
    int anc[6 * 8] = {0};
    for (int i = 0; i < n; i++) {
        if (i > 0) memcpy(anc + i * 8, anc + parent[i] * 8, (size_t)depth[i] * sizeof(int));
        anc[i * 8 + depth[i]] = i;
    }
    int *danc = dput(anc, sizeof anc), *ddep = dput(depth, sizeof depth);
    cu_attention(dout, dq, ldq, ldh, Hq, Hkv, hd, dkc, dvc, p0, danc, 8, ddep, gated, dsc, ldsc, n);
    float *tree = malloc((size_t)n * Hq * hd * 4);
    dget(tree, dout, (size_t)n * Hq * hd * 4);
    const int path[4] = {0, 1, 3, 5};
    /* the device's own normed and rotated rows, rearranged as a chain along the path */
    float *gkc = malloc((size_t)slots * kvw * 4), *gvc = malloc((size_t)slots * kvw * 4),
          *gq = malloc((size_t)n * ldq * 4);
    dget(gkc, dkc, (size_t)slots * kvw * 4), dget(gvc, dvc, (size_t)slots * kvw * 4), dget(gq, dq, (size_t)n * ldq * 4);
    float *kc2 = malloc((size_t)slots * kvw * 4), *vc2 = malloc((size_t)slots * kvw * 4),
          *q2 = malloc((size_t)n * ldq * 4);
    memcpy(kc2, gkc, (size_t)slots * kvw * 4), memcpy(vc2, gvc, (size_t)slots * kvw * 4),
        memcpy(q2, gq, (size_t)n * ldq * 4);
    for (int d = 0; d < 4; d++) {
        memcpy(kc2 + (size_t)(p0 + d) * kvw, gkc + (size_t)(p0 + path[d]) * kvw, (size_t)kvw * 4);
        memcpy(vc2 + (size_t)(p0 + d) * kvw, gvc + (size_t)(p0 + path[d]) * kvw, (size_t)kvw * 4);
        memcpy(q2 + (size_t)d * ldq, gq + (size_t)path[d] * ldq, (size_t)ldq * 4);
    }
    free(gkc), free(gvc), free(gq);
    cudaMemcpy(dkc, kc2, (size_t)slots * kvw * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dvc, vc2, (size_t)slots * kvw * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dq, q2, (size_t)n * ldq * 4, cudaMemcpyHostToDevice);
    cu_attention(dout, dq, ldq, ldh, Hq, Hkv, hd, dkc, dvc, p0, NULL, 0, NULL, gated, dsc, ldsc, 4);
    dget(out, dout, (size_t)4 * Hq * hd * 4);
    for (int d = 0; d < 4; d++)
        CHECK(memcmp(out + (size_t)d * Hq * hd, tree + (size_t)path[d] * Hq * hd, (size_t)Hq * hd * 4) == 0,
              "attention: tree node %d differs from the same token in a chain (depth %d)", path[d], d);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dkc), cudaFree(dvc), cudaFree(dqn), cudaFree(dkn);
    cudaFree(dinv), cudaFree(dpos), cudaFree(dout), cudaFree(dsc), cudaFree(danc), cudaFree(ddep);
    free(q), free(k), free(v), free(kc), free(vc), free(got), free(out), free(ref), free(tree), free(kc2), free(vc2);
    free(q2);
}

/* ---- Gated DeltaNet: conv + SiLU, L2 norms, recurrence ------------------------------------------ */

static void test_gdn(int dk, int dv) {
    const int Hk = 2, Hv = 4, K = 4, n = 7, C = 2 * Hk * dk + Hv * dv;
    const size_t win = (size_t)(K - 1) * C, HS = (size_t)Hv * dk * dv;
    float *qkv = malloc((size_t)n * C * 4), *w = malloc((size_t)C * K * 4), *win0 = malloc(win * 4);
    float *a = malloc((size_t)n * Hv * 4), *b = malloc((size_t)n * Hv * 4), nA[8], dtb[8];
    float *S0 = malloc(HS * 4);
    fill(qkv, (size_t)n * C, 2.0f), fill(w, (size_t)C * K, 0.6f), fill(win0, win, 2.0f);
    fill(a, (size_t)n * Hv, 3.0f), fill(b, (size_t)n * Hv, 3.0f), fill(S0, HS, 0.5f);
    for (int h = 0; h < Hv; h++) nA[h] = -expf(frand()), dtb[h] = frand();
    /* reference on the CPU: kn_conv_silu per 16 channels, the forward's normalisation, then
     * kn_gdn_recurrent per value head */
    float *ref = malloc((size_t)n * C * 4), *rwin = malloc(win * 4);
    memcpy(ref, qkv, (size_t)n * C * 4), memcpy(rwin, win0, win * 4);
    for (int c0 = 0; c0 < C; c0 += 16) {
        const int nc = C - c0 < 16 ? C - c0 : 16;
        float wn[15][16] = {{0}}, wt[16][16] = {{0}};
        for (int j = 0; j < K; j++)
            for (int i = 0; i < nc; i++) wt[j][i] = w[(size_t)(c0 + i) * K + j];
        for (int j = 0; j < K - 1; j++) memcpy(wn[j], rwin + (size_t)j * C + c0, (size_t)nc * 4);
        kn_conv_silu(ref + c0, (size_t)C, n, nc, K, wt[0], wn[0]);
        for (int j = 0; j < K - 1; j++) memcpy(rwin + (size_t)j * C + c0, wn[j], (size_t)nc * 4);
    }
    for (int r = 0; r < n * Hk; r++) {
        float *q = ref + (size_t)(r / Hk) * C + (size_t)(r % Hk) * dk, *k = q + (size_t)Hk * dk;
        float sq = 0, sk = 0;
        for (int i = 0; i < dk; i++) sq += q[i] * q[i], sk += k[i] * k[i];
        const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f), qs = 1.0f / sqrtf((float)dk);
        for (int i = 0; i < dk; i++) q[i] = q[i] * rq * qs, k[i] = k[i] * rk;
    }
    float *Sref = malloc(HS * 4), *oref = malloc((size_t)n * Hv * dv * 4);
    memcpy(Sref, S0, HS * 4);
    for (int h = 0; h < Hv; h++) {
        float gb[2 * KN_GDN_CHUNK];
        for (int t = 0; t < n; t++)
            gb[t] = nA[h] * kn_softplus(a[(size_t)t * Hv + h] + dtb[h]),
            gb[KN_GDN_CHUNK + t] = kn_sigmoid(b[(size_t)t * Hv + h]);
        const int kh = h / (Hv / Hk);
        const kn_gdn_io io = {.dk = dk,
                              .dv = dv,
                              .n = n,
                              .q = ref + (size_t)kh * dk,
                              .k = ref + (size_t)Hk * dk + (size_t)kh * dk,
                              .v = ref + 2 * (size_t)Hk * dk + (size_t)h * dv,
                              .ld = (size_t)C,
                              .g = gb,
                              .beta = gb + KN_GDN_CHUNK,
                              .out = oref + (size_t)h * dv,
                              .ldo = (size_t)Hv * dv};
        kn_gdn_recurrent(Sref + (size_t)h * dk * dv, &io);
    }
    /* the device, chain from S0 into S */
    float *dqkv = dput(qkv, (size_t)n * C * 4), *dw = dput(w, (size_t)C * K * 4), *dwin = dput(win0, win * 4);
    float *da = dput(a, (size_t)n * Hv * 4), *db = dput(b, (size_t)n * Hv * 4), *dnA = dput(nA, 32),
          *ddt = dput(dtb, 32);
    float *dS0 = dput(S0, HS * 4), *dS = dput(NULL, HS * 4), *dout = dput(NULL, (size_t)n * Hv * dv * 4);
    cu_conv_silu(dqkv, C, n, K, dw, dwin, NULL, NULL);
    cu_l2norm_qk(dqkv, C, Hk, dk, n);
    cu_gdn(dqkv, C, Hk, Hv, dk, dv, da, db, Hv, dnA, ddt, dS, dS0, dout, n, NULL, NULL);
    float *got = malloc((size_t)n * C * 4 > HS * 4 ? (size_t)n * C * 4 : HS * 4);
    dget(got, dqkv, (size_t)n * C * 4);
    CHECK(relerr(got, ref, (size_t)n * C, 1e-2) < 2e-6, "conv + silu + l2 norms (dk %d): %.3g", dk,
          relerr(got, ref, (size_t)n * C, 1e-2));
    dget(got, dwin, win * 4);
    CHECK(memcmp(got, rwin, win * 4) == 0, "conv window after the chain (dk %d)", dk);
    dget(got, dout, (size_t)n * Hv * dv * 4);
    CHECK(relerr(got, oref, (size_t)n * Hv * dv, 1e-2) < 1e-5, "gated delta output (dk %d dv %d): %.3g", dk, dv,
          relerr(got, oref, (size_t)n * Hv * dv, 1e-2));
    dget(got, dS, HS * 4);
    CHECK(relerr(got, Sref, HS, 1e-2) < 1e-5, "gated delta state (dk %d dv %d): %.3g", dk, dv,
          relerr(got, Sref, HS, 1e-2));
    float *Schain = malloc(HS * 4), *ochain = malloc((size_t)n * Hv * dv * 4);
    memcpy(Schain, got, HS * 4);
    dget(ochain, dout, (size_t)n * Hv * dv * 4);
    /* batch invariance: the same chain token by token gives the same bits */
    cudaMemcpy(dqkv, qkv, (size_t)n * C * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dwin, win0, win * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dS, S0, HS * 4, cudaMemcpyHostToDevice);
    for (int t = 0; t < n; t++) {
        cu_conv_silu(dqkv + (size_t)t * C, C, 1, K, dw, dwin, NULL, NULL);
        cu_l2norm_qk(dqkv + (size_t)t * C, C, Hk, dk, 1);
        cu_gdn(dqkv + (size_t)t * C, C, Hk, Hv, dk, dv, da + (size_t)t * Hv, db + (size_t)t * Hv, Hv, dnA, ddt, dS,
               NULL, dout + (size_t)t * Hv * dv, 1, NULL, NULL);
    }
    dget(got, dS, HS * 4);
    CHECK(memcmp(got, Schain, HS * 4) == 0, "gated delta: token by token != one call (state, dk %d)", dk);
    float *o1 = malloc((size_t)n * Hv * dv * 4);
    dget(o1, dout, (size_t)n * Hv * dv * 4);
    CHECK(memcmp(o1, ochain, (size_t)n * Hv * dv * 4) == 0, "gated delta: token by token != one call (output)");
    /* a tree: parents {-1, 0, 1, 1, 2, 4, 0}; node 5's path 0, 1, 2, 4, 5 is tokens 0..4 of a
     * chain when the tree's inputs at those nodes are the chain's; the root continues S / win */
    const int parent[7] = {-1, 0, 1, 1, 2, 4, 0}, path[5] = {0, 1, 2, 4, 5};
    float *tq = malloc((size_t)n * C * 4), *ta = malloc((size_t)n * Hv * 4), *tb = malloc((size_t)n * Hv * 4);
    fill(tq, (size_t)n * C, 2.0f), fill(ta, (size_t)n * Hv, 3.0f), fill(tb, (size_t)n * Hv, 3.0f);
    for (int d = 0; d < 5; d++) {
        memcpy(tq + (size_t)path[d] * C, qkv + (size_t)d * C, (size_t)C * 4);
        memcpy(ta + (size_t)path[d] * Hv, a + (size_t)d * Hv, (size_t)Hv * 4);
        memcpy(tb + (size_t)path[d] * Hv, b + (size_t)d * Hv, (size_t)Hv * 4);
    }
    int *dpar = dput(parent, sizeof parent);
    float *dnw = dput(NULL, (size_t)n * win * 4), *dnS = dput(NULL, (size_t)n * HS * 4);
    cudaMemcpy(dqkv, tq, (size_t)n * C * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(da, ta, (size_t)n * Hv * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, tb, (size_t)n * Hv * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dwin, win0, win * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dS, S0, HS * 4, cudaMemcpyHostToDevice);
    cu_conv_silu(dqkv, C, n, K, dw, dwin, dpar, dnw);
    cu_l2norm_qk(dqkv, C, Hk, dk, n);
    cu_gdn(dqkv, C, Hk, Hv, dk, dv, da, db, Hv, dnA, ddt, dS, NULL, dout, n, dpar, dnS);
    float *tout = malloc((size_t)n * Hv * dv * 4);
    dget(tout, dout, (size_t)n * Hv * dv * 4);
    int same = 1;
    for (int d = 0; d < 5; d++)
        same &= memcmp(tout + (size_t)path[d] * Hv * dv, ochain + (size_t)d * Hv * dv, (size_t)Hv * dv * 4) == 0;
    CHECK(same, "gated delta: tree nodes differ from the same tokens in a chain (dk %d)", dk);
    /* node 5's state after 5 chain tokens: run the chain of 5 from S0 */
    cudaMemcpy(dqkv, qkv, (size_t)n * C * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(da, a, (size_t)n * Hv * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, (size_t)n * Hv * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dwin, win0, win * 4, cudaMemcpyHostToDevice);
    cu_conv_silu(dqkv, C, 5, K, dw, dwin, NULL, NULL);
    cu_l2norm_qk(dqkv, C, Hk, dk, 5);
    cu_gdn(dqkv, C, Hk, Hv, dk, dv, da, db, Hv, dnA, ddt, dS, dS0, NULL, 5, NULL, NULL);
    float *S5 = malloc(HS * 4), *W5 = malloc(win * 4);
    dget(S5, dS, HS * 4), dget(W5, dwin, win * 4);
    dget(got, dnS + (size_t)5 * HS, HS * 4);
    CHECK(memcmp(got, S5, HS * 4) == 0, "gated delta: tree node state != chain state (dk %d)", dk);
    dget(got, dnw + (size_t)5 * win, win * 4);
    CHECK(memcmp(got, W5, win * 4) == 0, "conv: tree node window != chain window (dk %d)", dk);
    cudaFree(dqkv), cudaFree(dw), cudaFree(dwin), cudaFree(da), cudaFree(db), cudaFree(dnA), cudaFree(ddt);
    cudaFree(dS0), cudaFree(dS), cudaFree(dout), cudaFree(dpar), cudaFree(dnw), cudaFree(dnS);
    free(qkv), free(w), free(win0), free(a), free(b), free(S0), free(ref), free(rwin), free(Sref), free(oref),
        free(got);
    free(Schain), free(ochain), free(o1), free(tq), free(ta), free(tb), free(tout), free(S5), free(W5);
}

static void test_embed(void) {
    const int V = 300, H = 132, n = 5;
    uint16_t *e = malloc((size_t)V * H * 2);
    for (size_t i = 0; i < (size_t)V * H; i++) e[i] = st_f32_to_bf16(frand());
    int32_t tok[5] = {0, 299, 17, 17, 150};
    void *de = dput(e, (size_t)V * H * 2);
    int32_t *dt = dput(tok, sizeof tok);
    float *dx = dput(NULL, (size_t)n * H * 4), *x = malloc((size_t)n * H * 4);
    const cu_mat E = {.dtype = CU_BF16, .w = de, .rows = V, .cols = H};
    cu_embed(dx, &E, dt, n);
    dget(x, dx, (size_t)n * H * 4);
    int ok = 1;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < H; i++) ok &= x[(size_t)t * H + i] == st_bf16_to_f32(e[(size_t)tok[t] * H + i]);
    CHECK(ok, "embedding rows");
    cudaFree(de), cudaFree(dt), cudaFree(dx);
    free(e), free(x);
}

int main(void) {
    if (dfl_device_check(DFL_DEVICE_CUDA) != DFL_OK) {
        printf("test_backend_ops: skipped: %s\n", dfl_errmsg());
        return 77;
    }
    /* BF16 with cols % 32 == 0 takes the tensor cores; the others the CUDA-core kernel */
    const int shapes[][2] = {{37, 64},    {129, 300}, {64, 1030},   {17, 77},   {9, 8200},
                             {300, 5120}, {48, 5120}, {1000, 2048}, {40, 17408}};
    for (int dt = 0; dt < 3; dt++)
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
            test_matmul((cu_dtype)dt, shapes[k][0], shapes[k][1]);
    test_embed();
    test_norms();
    test_attention(0);
    test_attention(1);
    test_gdn(32, 32);
    test_gdn(128, 128);
    test_gdn(64, 48);
    const cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "CUDA: %s", cudaGetErrorString(e));
    return test_done("test_backend_ops");
}
