/* Compute kernels. All activations are float32; weight matrices may be F32, F16 or BF16
 * and are read in place from the mmap. */
#ifndef DFL_KERNELS_H
#define DFL_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "dfl/safetensors.h"

/* A weight matrix W [rows, cols], row-major, y = W x. data is element-aligned (the loader
 * copies unaligned tensors into `owned`). */
typedef struct dfl_mat {
    st_dtype dtype;
    const void *data;
    int rows, cols;
    void *owned; /* non-NULL when data is a private aligned copy */
} dfl_mat;

/* y[n][rows] = x[n][cols] . W^T — each weight row is read once for all n inputs. */
void kn_matmul(float *y, const float *x, const dfl_mat *w, int n);
/* One row of W as float32: out[cols]. */
void kn_mat_row(const dfl_mat *w, int row, float *out);

/* y = x * rsqrt(mean(x^2) + eps) * w  (w already holds the effective multiplier). */
void kn_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* In-place SiLU-gated product: a[i] = silu(a[i]) * b[i]. */
void kn_swiglu(float *a, const float *b, int n);
/* NeoX half-split rotary embedding over the first rot dims of x[hd] (cos/sin [rot/2]). */
void kn_rope(float *x, const float *cos, const float *sin, int rot);
/* In-place softmax over n values. */
void kn_softmax(float *x, int n);
/* Index of the largest value (first on ties). */
int kn_argmax(const float *x, int n);

static inline float kn_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float kn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float kn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#endif
