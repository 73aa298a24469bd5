/* The CUDA backend's ops (cuda_ops.h). Built without fast-math: expf, sqrtf and the divisions
 * are IEEE (or within 2 ulp), so results follow the CPU's float32 up to summation order.
 *
 * Batch invariance: no op splits a token's reduction by the number of tokens in the call. The
 * matrix product gives each output a fixed order (lane l adds columns 4l + 128k, k rising, then
 * a fixed butterfly over the warp), token tiles only decide how often a weight row is read. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ops.h"

#define WARP 32

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of blockDim.x (a multiple of 32, <= 1024) threads in a fixed order; every
 * thread gets the result. red: shared scratch of 32 floats. */
static __device__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

static __device__ float block_max(float v, float *red) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return warp_max(v);
}

static __device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- weights: 4 consecutive elements as float ------------------------------------------ */

template <typename WT> struct wload;
template <> struct wload<float> {
    static __device__ __forceinline__ void four(const float *p, float *o) {
        const float4 v = __ldg((const float4 *)p);
        o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    }
    static __device__ __forceinline__ float one(const float *p) { return __ldg(p); }
};
template <> struct wload<__nv_bfloat16> {
    static __device__ __forceinline__ void four(const __nv_bfloat16 *p, float *o) {
        const uint2 v = __ldg((const uint2 *)p);
        o[0] = __uint_as_float(v.x << 16), o[1] = __uint_as_float(v.x & 0xffff0000u);
        o[2] = __uint_as_float(v.y << 16), o[3] = __uint_as_float(v.y & 0xffff0000u);
    }
    static __device__ __forceinline__ float one(const __nv_bfloat16 *p) {
        return __uint_as_float((uint32_t)__ldg((const unsigned short *)p) << 16);
    }
};
template <> struct wload<__half> {
    static __device__ __forceinline__ void four(const __half *p, float *o) {
        const uint2 v = __ldg((const uint2 *)p);
        const __half2 a = *(const __half2 *)&v.x, b = *(const __half2 *)&v.y;
        const float2 fa = __half22float2(a), fb = __half22float2(b);
        o[0] = fa.x, o[1] = fa.y, o[2] = fb.x, o[3] = fb.y;
    }
    static __device__ __forceinline__ float one(const __half *p) { return __half2float(__ldg(p)); }
};

/* ---- embedding --------------------------------------------------------------------------- */

template <typename WT> __global__ void embed_k(float *x, const WT *E, const int32_t *tok, int H) {
    const int t = blockIdx.y;
    const WT *row = E + (size_t)tok[t] * H;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x)
        x[(size_t)t * H + i] = wload<WT>::one(row + i);
}

extern "C" void cu_embed(float *x, const cu_mat *E, const int32_t *tok, int n) {
    const dim3 grid((E->cols + 255) / 256, n);
    switch (E->dtype) {
    case CU_F32: embed_k<<<grid, 256>>>(x, (const float *)E->w, tok, E->cols); break;
    case CU_F16: embed_k<<<grid, 256>>>(x, (const __half *)E->w, tok, E->cols); break;
    case CU_BF16: embed_k<<<grid, 256>>>(x, (const __nv_bfloat16 *)E->w, tok, E->cols); break;
    }
}

/* ---- matrix product ---------------------------------------------------------------------- */

#define MM_WARPS 8   /* rows per block, one per warp */
#define MM_SMEM 8192 /* floats of x staged per block (32 KB) */

/* TN tokens per tile; x of the tile staged in shared memory by chunks of MM_SMEM / TN columns
 * (a multiple of 128, so a lane's column order does not depend on TN). VEC: cols % 4 == 0, lane
 * l takes columns 4l + 128k; else lane l takes l + 32k. */
template <typename WT, int TN, bool VEC>
__global__ void __launch_bounds__(MM_WARPS *WARP)
    matmul_k(float *y, const float *x, const WT *W, int rows, int cols, int n) {
    __shared__ __align__(16) float xs[MM_SMEM];
    const int CH = MM_SMEM / TN;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int row = blockIdx.x * MM_WARPS + warp;
    const WT *wr = W + (size_t)(row < rows ? row : 0) * cols;
    for (int t0 = 0; t0 < n; t0 += TN) {
        const int nt = n - t0 < TN ? n - t0 : TN;
        float acc[TN];
#pragma unroll
        for (int t = 0; t < TN; t++) acc[t] = 0.0f;
        for (int c0 = 0; c0 < cols; c0 += CH) {
            const int cw = cols - c0 < CH ? cols - c0 : CH;
            __syncthreads();
            for (int i = threadIdx.x; i < TN * CH; i += blockDim.x) {
                const int t = i / CH, c = i % CH;
                xs[i] = t < nt && c < cw ? x[(size_t)(t0 + t) * cols + c0 + c] : 0.0f;
            }
            __syncthreads();
            if (row >= rows) continue;
            if (VEC) {
#pragma unroll 4
                for (int c = 4 * lane; c < cw; c += 4 * WARP) {
                    float w[4];
                    wload<WT>::four(wr + c0 + c, w);
#pragma unroll
                    for (int t = 0; t < TN; t++) {
                        const float4 xv = *(const float4 *)(xs + t * CH + c);
                        acc[t] = fmaf(w[0], xv.x, acc[t]);
                        acc[t] = fmaf(w[1], xv.y, acc[t]);
                        acc[t] = fmaf(w[2], xv.z, acc[t]);
                        acc[t] = fmaf(w[3], xv.w, acc[t]);
                    }
                }
            } else {
                for (int c = lane; c < cw; c += WARP) {
                    const float w = wload<WT>::one(wr + c0 + c);
#pragma unroll
                    for (int t = 0; t < TN; t++) acc[t] = fmaf(w, xs[t * CH + c], acc[t]);
                }
            }
        }
        if (row < rows) {
#pragma unroll
            for (int t = 0; t < TN; t++) {
                const float s = warp_sum(acc[t]);
                if (lane == t % WARP && t < nt) y[(size_t)(t0 + t) * rows + row] = s;
            }
        }
    }
}

template <typename WT> static void matmul_t(float *y, const float *x, const cu_mat *W, int n) {
    const int blocks = (W->rows + MM_WARPS - 1) / MM_WARPS;
    const WT *w = (const WT *)W->w;
    const bool vec = W->cols % 4 == 0;
    /* the tile size only sets how often a weight row is read; each output's order is fixed */
    if (n == 1) {
        if (vec) matmul_k<WT, 1, true><<<blocks, MM_WARPS * WARP>>>(y, x, w, W->rows, W->cols, n);
        else matmul_k<WT, 1, false><<<blocks, MM_WARPS * WARP>>>(y, x, w, W->rows, W->cols, n);
    } else if (n <= 4) {
        if (vec) matmul_k<WT, 4, true><<<blocks, MM_WARPS * WARP>>>(y, x, w, W->rows, W->cols, n);
        else matmul_k<WT, 4, false><<<blocks, MM_WARPS * WARP>>>(y, x, w, W->rows, W->cols, n);
    } else {
        if (vec) matmul_k<WT, 16, true><<<blocks, MM_WARPS * WARP>>>(y, x, w, W->rows, W->cols, n);
        else matmul_k<WT, 16, false><<<blocks, MM_WARPS * WARP>>>(y, x, w, W->rows, W->cols, n);
    }
}

/* BF16 weights on the tensor cores, at float32 accuracy: each activation is split into three
 * bf16 parts (x = hi + mid + lo to 2^-27), each part multiplied exactly by the bf16 weights in
 * mma.m16n8k16 with float32 accumulation; the six products of a 32-column chunk start from zero
 * and are added to the running sum in IEEE float32, so the tensor cores' own rounding spans one
 * chunk only. A warp computes 16 rows for NT tiles of 8 tokens over every MMA_KS-th chunk
 * (thread (g, t) loads 16 bytes of rows g and g+8 and 8 activations of token g; the mma's k order
 * is a fixed permutation of the chunk's columns, the same for weights and activations); the
 * MMA_KS partial sums meet in shared memory in warp order. Every output's operations are thus
 * fixed by the matrix alone: batch invariant. PF chunks are loaded ahead. (Measured on an H200 at
 * n = 1: contiguous chunk ranges per warp with 8 ahead and 2 blocks per SM decoded 30% slower.) */
#define MMA_KS 8

static __device__ __forceinline__ void mma_bf16(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two activations as three bf16 pairs (low half = the first), hi + mid + lo = the pair. */
static __device__ __forceinline__ void split3(float x0, float x1, uint32_t *hi, uint32_t *mid, uint32_t *lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const float r0 = x0 - hf.x, r1 = x1 - hf.y;
    const __nv_bfloat162 m = __floats2bfloat162_rn(r0, r1);
    const float2 mf = __bfloat1622float2(m);
    const __nv_bfloat162 l = __floats2bfloat162_rn(r0 - mf.x, r1 - mf.y);
    *hi = *(const uint32_t *)&h, *mid = *(const uint32_t *)&m, *lo = *(const uint32_t *)&l;
}

template <int NT, int PF>
__global__ void __launch_bounds__(MMA_KS *WARP)
    mma_matmul_k(float *y, const float *x, const __nv_bfloat16 *W, int rows, int cols, int n) {
    __shared__ float red[MMA_KS * WARP * NT * 4];
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, g = lane >> 2, tg = lane & 3;
    const int r0 = blockIdx.x * 16 + g, r1 = r0 + 8, tbase = blockIdx.y * NT * 8, nch = cols / 32;
    const uint4 *p0 = (const uint4 *)(W + (size_t)(r0 < rows ? r0 : 0) * cols) + tg;
    const uint4 *p1 = (const uint4 *)(W + (size_t)(r1 < rows ? r1 : 0) * cols) + tg;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    /* warp w sums every MMA_KS-th chunk from chunk w */
    uint4 ra[PF], rb[PF];
#pragma unroll
    for (int p = 0; p < PF; p++) {
        const int c = w + p * MMA_KS;
        ra[p] = c < nch && r0 < rows ? __ldg(p0 + (size_t)c * 4) : zero;
        rb[p] = c < nch && r1 < rows ? __ldg(p1 + (size_t)c * 4) : zero;
    }
    for (int c0 = w; c0 < nch; c0 += PF * MMA_KS) {
#pragma unroll
        for (int p = 0; p < PF; p++) {
            const int c = c0 + p * MMA_KS;
            if (c >= nch) break;
            const uint4 a = ra[p], b = rb[p];
            const int cn = c + PF * MMA_KS; /* the chunk this slot holds next */
            ra[p] = cn < nch && r0 < rows ? __ldg(p0 + (size_t)cn * 4) : zero;
            rb[p] = cn < nch && r1 < rows ? __ldg(p1 + (size_t)cn * 4) : zero;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int t = tbase + j * 8 + g;
                float4 u = make_float4(0.f, 0.f, 0.f, 0.f), v = u;
                if (t < n) {
                    const float4 *xp = (const float4 *)(x + (size_t)t * cols + (size_t)c * 32 + tg * 8);
                    u = __ldg(xp), v = __ldg(xp + 1);
                }
                uint32_t h[4], m[4], l[4];
                split3(u.x, u.y, &h[0], &m[0], &l[0]);
                split3(u.z, u.w, &h[1], &m[1], &l[1]);
                split3(v.x, v.y, &h[2], &m[2], &l[2]);
                split3(v.z, v.w, &h[3], &m[3], &l[3]);
                float d[4] = {0.f, 0.f, 0.f, 0.f};
                mma_bf16(d, a.x, b.x, a.y, b.y, h[0], h[1]);
                mma_bf16(d, a.x, b.x, a.y, b.y, m[0], m[1]);
                mma_bf16(d, a.x, b.x, a.y, b.y, l[0], l[1]);
                mma_bf16(d, a.z, b.z, a.w, b.w, h[2], h[3]);
                mma_bf16(d, a.z, b.z, a.w, b.w, m[2], m[3]);
                mma_bf16(d, a.z, b.z, a.w, b.w, l[2], l[3]);
#pragma unroll
                for (int i = 0; i < 4; i++) acc[j][i] += d[i];
            }
        }
    }
    float *mine = red + ((size_t)w * WARP + lane) * NT * 4;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) mine[j * 4 + i] = acc[j][i];
    __syncthreads();
    if (w != 0) return;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float s = red[(size_t)lane * NT * 4 + j * 4 + i];
            for (int ww = 1; ww < MMA_KS; ww++) s += red[((size_t)ww * WARP + lane) * NT * 4 + j * 4 + i];
            const int r = i < 2 ? r0 : r1, t = tbase + j * 8 + 2 * tg + (i & 1);
            if (r < rows && t < n) y[(size_t)t * rows + r] = s;
        }
}

/* The tensor-core path takes BF16 matrices of whole 32-column chunks (every Qwen shape) unless
 * DFL_CUDA_MATMUL=fma asks for the CUDA-core kernel (comparisons); the choice depends on the
 * matrix only. */
static bool use_mma(const cu_mat *W) {
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("DFL_CUDA_MATMUL");
        env = e && strcmp(e, "fma") == 0 ? 0 : 1;
    }
    return env && W->dtype == CU_BF16 && W->cols % 32 == 0;
}

static void mma_matmul(float *y, const float *x, const cu_mat *W, int n) {
    const int tiles = (n + 7) / 8, mb = (W->rows + 15) / 16;
    const __nv_bfloat16 *w = (const __nv_bfloat16 *)W->w;
    const int NT = tiles <= 1 ? 1 : tiles <= 2 ? 2 : tiles <= 4 ? 4 : 8;
    const dim3 grid(mb, (tiles + NT - 1) / NT);
    switch (NT) {
    case 1: mma_matmul_k<1, 4><<<grid, MMA_KS * WARP>>>(y, x, w, W->rows, W->cols, n); break;
    case 2: mma_matmul_k<2, 4><<<grid, MMA_KS * WARP>>>(y, x, w, W->rows, W->cols, n); break;
    case 4: mma_matmul_k<4, 4><<<grid, MMA_KS * WARP>>>(y, x, w, W->rows, W->cols, n); break;
    default: mma_matmul_k<8, 4><<<grid, MMA_KS * WARP>>>(y, x, w, W->rows, W->cols, n); break;
    }
}

extern "C" void cu_matmul(float *y, const float *x, const cu_mat *W, int n) {
    if (use_mma(W)) {
        mma_matmul(y, x, W, n);
        return;
    }
    switch (W->dtype) {
    case CU_F32: matmul_t<float>(y, x, W, n); break;
    case CU_F16: matmul_t<__half>(y, x, W, n); break;
    case CU_BF16: matmul_t<__nv_bfloat16>(y, x, W, n); break;
    }
}

/* ---- norms and elementwise --------------------------------------------------------------- */

__global__ void rmsnorm_k(float *y, const float *x, const float *w, int dim, float eps) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * r);
}

static int norm_threads(int dim) { return dim >= 1024 ? 1024 : dim >= 256 ? 256 : dim >= 64 ? 64 : 32; }

extern "C" void cu_rmsnorm(float *y, const float *x, const float *w, int rows, int dim, float eps) {
    rmsnorm_k<<<rows, norm_threads(dim)>>>(y, x, w, dim, eps);
}

__global__ void add_k(float *x, const float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

__global__ void swiglu_k(float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = silu(a[i]) * b[i];
}

static unsigned ew_blocks(size_t n) {
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

extern "C" void cu_add(float *x, const float *y, size_t n) { add_k<<<ew_blocks(n), 256>>>(x, y, n); }
extern "C" void cu_swiglu(float *a, const float *b, size_t n) { swiglu_k<<<ew_blocks(n), 256>>>(a, b, n); }

/* ---- full attention ---------------------------------------------------------------------- */

/* One head of one token per block (blockIdx.x = token, blockIdx.y = head; keys from Hq query
 * heads then Hkv key heads): RMSNorm over hd, rotation of the first rot dims. */
__global__ void qk_norm_rope_k(float *q, int ldq, int ldh, int Hq, float *k, const float *v, int Hkv, int hd, int rot,
                               const float *qnorm, const float *knorm, float eps, const int *pos, const float *inv_freq,
                               float *kc, float *vc, int slot0) {
    __shared__ float red[32];
    __shared__ float buf[1024];
    const int t = blockIdx.x, h = blockIdx.y, kvw = Hkv * hd;
    const bool isq = h < Hq;
    float *p = isq ? q + (size_t)t * ldq + (size_t)h * ldh : k + (size_t)t * kvw + (size_t)(h - Hq) * hd;
    const float *w = isq ? qnorm : knorm;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss = fmaf(p[i], p[i], ss);
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = w[i] * (p[i] * r);
    __syncthreads();
    const int half = rot / 2;
    const float fp = (float)pos[t];
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = buf[i];
        if (i < rot) {
            const int j = i < half ? i : i - half;
            const float f = fp * inv_freq[j], c = cosf(f), s = sinf(f);
            o = i < half ? buf[i] * c - buf[i + half] * s : buf[i] * c + buf[i - half] * s;
        }
        p[i] = o;
        if (!isq) {
            const size_t off = (size_t)(slot0 + t) * kvw + (size_t)(h - Hq) * hd + i;
            kc[off] = o;
            vc[off] = v[(size_t)t * kvw + (size_t)(h - Hq) * hd + i];
        }
    }
}

extern "C" void cu_qk_norm_rope(float *q, int ldq, int ldh, int Hq, float *k, const float *v, int Hkv, int hd, int rot,
                                const float *qnorm, const float *knorm, float eps, const int *pos,
                                const float *inv_freq, float *kc, float *vc, int slot0, int n) {
    const dim3 grid(n, Hq + Hkv);
    qk_norm_rope_k<<<grid, hd >= 256  ? 256
                           : hd >= 64 ? 64
                                      : 32>>>(q, ldq, ldh, Hq, k, v, Hkv, hd, rot, qnorm, knorm, eps, pos, inv_freq, kc,
                                              vc, slot0);
}

#define ATT_THREADS 256

/* Cache row of token t's i-th visible key. */
static __device__ __forceinline__ int att_slot(int i, int p0, const int *anc_t) {
    return i < p0 || !anc_t ? i : p0 + anc_t[i - p0];
}

__global__ void __launch_bounds__(ATT_THREADS)
    attention_k(float *out, const float *q, int ldq, int ldh, int Hq, int Hkv, int hd, const float *kc, const float *vc,
                int p0, const int *anc, int ld_anc, const int *depth, int gated, float *scores, int ldsc) {
    __shared__ float red[32];
    const int t = blockIdx.x, h = blockIdx.y, kvh = h / (Hq / Hkv), kvw = Hkv * hd;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    const int *anc_t = anc ? anc + (size_t)t * ld_anc : NULL;
    const int len = p0 + (anc ? depth[t] : t) + 1;
    const float *qh = q + (size_t)t * ldq + (size_t)h * ldh;
    float *sc = scores + ((size_t)t * Hq + h) * ldsc;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = warp; i < len; i += nw) { /* scores: a warp per key */
        const float *kr = kc + (size_t)att_slot(i, p0, anc_t) * kvw + (size_t)kvh * hd;
        float d = 0.0f;
        for (int j = lane; j < hd; j += WARP) d = fmaf(qh[j], kr[j], d);
        d = warp_sum(d);
        if (lane == 0) sc[i] = d * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int i = threadIdx.x; i < len; i += blockDim.x) m = fmaxf(m, sc[i]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const float e = expf(sc[i] - m);
        sc[i] = e;
        s += e;
    }
    s = block_sum(s, red); /* ends with a barrier: every sc[i] is written */
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float o = 0.0f;
        for (int i = 0; i < len; i++)
            o = fmaf(sc[i] * inv, vc[(size_t)att_slot(i, p0, anc_t) * kvw + (size_t)kvh * hd + j], o);
        if (gated) o *= sigmoid(qh[hd + j]);
        out[(size_t)t * Hq * hd + (size_t)h * hd + j] = o;
    }
}

extern "C" void cu_attention(float *out, const float *q, int ldq, int ldh, int Hq, int Hkv, int hd, const float *kc,
                             const float *vc, int p0, const int *anc, int ld_anc, const int *depth, int gated,
                             float *scores, int ldsc, int n) {
    const dim3 grid(n, Hq);
    attention_k<<<grid, ATT_THREADS>>>(out, q, ldq, ldh, Hq, Hkv, hd, kc, vc, p0, anc, ld_anc, depth, gated, scores,
                                       ldsc);
}

/* ---- Gated DeltaNet ------------------------------------------------------------------------ */

#define CONV_MAXK 16

/* One channel per thread, tokens in order. */
__global__ void conv_silu_k(float *qkv, int C, int n, int K, const float *w, float *win, const int *parent,
                            float *node_win) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float wt[CONV_MAXK], wn[CONV_MAXK];
    for (int j = 0; j < K; j++) wt[j] = w[(size_t)c * K + j];
    const size_t wsz = (size_t)(K - 1) * C;
    if (!parent)
        for (int j = 0; j < K - 1; j++) wn[j] = win[(size_t)j * C + c];
    for (int t = 0; t < n; t++) {
        if (parent) {
            const float *src = parent[t] < 0 ? win : node_win + (size_t)parent[t] * wsz;
            for (int j = 0; j < K - 1; j++) wn[j] = src[(size_t)j * C + c];
        }
        const float xin = qkv[(size_t)t * C + c];
        float acc = wt[K - 1] * xin;
        for (int j = 0; j < K - 1; j++) acc = fmaf(wt[j], wn[j], acc);
        qkv[(size_t)t * C + c] = silu(acc);
        for (int j = 0; j + 1 < K - 1; j++) wn[j] = wn[j + 1];
        if (K > 1) wn[K - 2] = xin;
        if (parent)
            for (int j = 0; j < K - 1; j++) node_win[(size_t)t * wsz + (size_t)j * C + c] = wn[j];
    }
    if (!parent)
        for (int j = 0; j < K - 1; j++) win[(size_t)j * C + c] = wn[j];
}

extern "C" void cu_conv_silu(float *qkv, int C, int n, int K, const float *w, float *win, const int *parent,
                             float *node_win) {
    conv_silu_k<<<(C + 127) / 128, 128>>>(qkv, C, n, K, w, win, parent, node_win);
}

/* A warp per (token, key head). */
__global__ void l2norm_qk_k(float *qkv, int C, int Hk, int dk, int rows) {
    const int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (r >= rows) return;
    float *q = qkv + (size_t)(r / Hk) * C + (size_t)(r % Hk) * dk, *k = q + (size_t)Hk * dk;
    float sq = 0.0f, sk = 0.0f;
    for (int i = lane; i < dk; i += WARP) sq = fmaf(q[i], q[i], sq), sk = fmaf(k[i], k[i], sk);
    sq = warp_sum(sq), sk = warp_sum(sk);
    const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f), qs = 1.0f / sqrtf((float)dk);
    for (int i = lane; i < dk; i += WARP) q[i] = q[i] * rq * qs, k[i] = k[i] * rk;
}

extern "C" void cu_l2norm_qk(float *qkv, int C, int Hk, int dk, int n) {
    const int rows = n * Hk;
    l2norm_qk_k<<<(rows + 7) / 8, 256>>>(qkv, C, Hk, dk, rows);
}

/* Value head h per block; column j of its [dk, dv] state held by two threads (rows 0..dk/2-1 and
 * dk/2..dk-1, in registers across the tokens of a chain), whose partial sums meet by one shuffle
 * (the same sum in both: a + b = b + a); a tree node loads its parent's column and stores its
 * own. */
template <int DK>
__global__ void gdn_k(const float *qkv, int C, int Hk, int Hv, int dv, const float *a, const float *b, int ld_ab,
                      const float *neg_exp_A, const float *dt_bias, float *S, const float *S0, float *out, int n,
                      const int *parent, float *node_S) {
    constexpr int HALF = DK / 2;
    __shared__ float sk[DK], sq[DK];
    const int h = blockIdx.x, j = threadIdx.x >> 1, part = threadIdx.x & 1, kh = h / (Hv / Hk);
    const int in_warp = (int)blockDim.x - (int)(threadIdx.x & ~31u);
    const unsigned mask = in_warp >= 32 ? 0xffffffffu : (1u << in_warp) - 1u;
    const size_t HS = (size_t)Hv * DK * dv, hoff = (size_t)h * DK * dv + (size_t)part * HALF * dv + j;
    float s[HALF];
    if (!parent) {
        const float *src = (S0 ? S0 : S) + hoff;
#pragma unroll
        for (int i = 0; i < HALF; i++) s[i] = src[(size_t)i * dv];
    }
    const float nA = neg_exp_A[h], dtb = dt_bias[h];
    for (int t = 0; t < n; t++) {
        if (parent) {
            const float *src = (parent[t] < 0 ? S : node_S + (size_t)parent[t] * HS) + hoff;
#pragma unroll
            for (int i = 0; i < HALF; i++) s[i] = src[(size_t)i * dv];
        }
        const float *row = qkv + (size_t)t * C;
        __syncthreads(); /* the previous token's sk / sq are read */
        for (int i = threadIdx.x; i < DK; i += blockDim.x) {
            sq[i] = row[(size_t)kh * DK + i];
            sk[i] = row[(size_t)Hk * DK + (size_t)kh * DK + i];
        }
        __syncthreads();
        const float g = nA * softplus(a[(size_t)t * ld_ab + h] + dtb), beta = sigmoid(b[(size_t)t * ld_ab + h]);
        const float decay = expf(g);
        const float *kk = sk + part * HALF, *qq = sq + part * HALF;
        float u = 0.0f;
#pragma unroll
        for (int i = 0; i < HALF; i++) {
            s[i] *= decay;
            u = fmaf(s[i], kk[i], u);
        }
        u += __shfl_xor_sync(mask, u, 1);
        const float d = (row[2 * (size_t)Hk * DK + (size_t)h * dv + j] - u) * beta;
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < HALF; i++) {
            s[i] = fmaf(kk[i], d, s[i]);
            o = fmaf(s[i], qq[i], o);
        }
        o += __shfl_xor_sync(mask, o, 1);
        if (out && part == 0) out[(size_t)t * Hv * dv + (size_t)h * dv + j] = o;
        if (parent) {
            float *dst = node_S + (size_t)t * HS + hoff;
#pragma unroll
            for (int i = 0; i < HALF; i++) dst[(size_t)i * dv] = s[i];
        }
    }
    if (!parent) {
        float *dst = S + hoff;
#pragma unroll
        for (int i = 0; i < HALF; i++) dst[(size_t)i * dv] = s[i];
    }
}

extern "C" int cu_gdn_supported(int dk, int dv) {
    return (dk == 16 || dk == 32 || dk == 64 || dk == 128) && dv >= 1 && dv <= 512;
}

extern "C" void cu_gdn(const float *qkv, int C, int Hk, int Hv, int dk, int dv, const float *a, const float *b,
                       int ld_ab, const float *neg_exp_A, const float *dt_bias, float *S, const float *S0, float *out,
                       int n, const int *parent, float *node_S) {
    switch (dk) {
#define GDN_CASE(D)                                                                                                   \
    case D:                                                                                                           \
        gdn_k<D><<<Hv, 2 * dv>>>(qkv, C, Hk, Hv, dv, a, b, ld_ab, neg_exp_A, dt_bias, S, S0, out, n, parent, node_S); \
        break;
        GDN_CASE(16)
        GDN_CASE(32)
        GDN_CASE(64)
        GDN_CASE(128)
#undef GDN_CASE
    }
}

__global__ void gated_rmsnorm_k(float *z, const float *o, const float *w, int dv, float eps) {
    __shared__ float red[32];
    const float *orow = o + (size_t)blockIdx.x * dv;
    float *zr = z + (size_t)blockIdx.x * dv;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss = fmaf(orow[i], orow[i], ss);
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x) zr[i] = silu(zr[i]) * (w[i] * (orow[i] * r));
}

extern "C" void cu_gated_rmsnorm(float *z, const float *o, const float *w, int rows, int dv, float eps) {
    gated_rmsnorm_k<<<rows, norm_threads(dv)>>>(z, o, w, dv, eps);
}

/* ---- argmax ---------------------------------------------------------------------------------- */

__global__ void argmax_k(int32_t *ids, const float *x, int V, unsigned *bad) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float *r = x + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int idx = -1;
    unsigned nb = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = r[i];
        if (!isfinite(v)) nb++;
        if (idx < 0 || v > best) best = v, idx = i; /* first index of the largest, per thread */
    }
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (oi >= 0 && (idx < 0 || ov > best || (ov == best && oi < idx))) best = ov, idx = oi;
    }
    if (lane == 0) bv[w] = best, bi[w] = idx;
    __syncthreads();
    if (w == 0) {
        best = lane < nw ? bv[lane] : -INFINITY;
        idx = lane < nw ? bi[lane] : -1;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (oi >= 0 && (idx < 0 || ov > best || (ov == best && oi < idx))) best = ov, idx = oi;
        }
        if (lane == 0) ids[blockIdx.x] = idx;
    }
    if (nb) atomicAdd(bad, nb);
}

extern "C" void cu_argmax(int32_t *ids, const float *x, int rows, int V, unsigned *bad) {
    argmax_k<<<rows, 1024>>>(ids, x, V, bad);
}

/* ---- bandwidth probe ----------------------------------------------------------------------- */

__global__ void read_probe_k(const float4 *buf, size_t n4, float *out) {
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = __ldcs(buf + i); /* streaming: no reuse */
        s += v.x + v.y + v.z + v.w;
    }
    s = warp_sum(s);
    if (threadIdx.x % WARP == 0) atomicAdd(out + blockIdx.x, s);
}

extern "C" void cu_read_probe(const void *buf, size_t n4, float *out) {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    read_probe_k<<<sms * 8, 256>>>((const float4 *)buf, n4, out);
}
