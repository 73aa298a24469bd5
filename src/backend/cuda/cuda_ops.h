/* The CUDA backend's ops (cuda_ops.cu): one launcher per named op of the forward, device pointers
 * in, enqueued on the default stream (asynchronous to the host). All activations are float32;
 * weights F32, F16 or BF16, converted in registers. Every op computes a token's outputs with the
 * same operations whatever the number of tokens in the call and whatever the others are, so a
 * forward over n tokens equals n single-token forwards bit for bit, and a tree node equals the
 * same token in a chain (attention walks each token's visible keys in position order). */
#ifndef DFL_CUDA_OPS_H
#define DFL_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cu_dtype { CU_F32 = 0, CU_F16 = 1, CU_BF16 = 2 } cu_dtype;

/* A weight matrix W [rows, cols] row-major on the device. */
typedef struct cu_mat {
    cu_dtype dtype;
    const void *w;
    int rows, cols;
} cu_mat;

/* x [n, H] = float(E[tok[t]]) ; tok [n] on the device. */
void cu_embed(float *x, const cu_mat *E, const int32_t *tok, int n);
/* y [n, rows] = x [n, cols] . W^T */
void cu_matmul(float *y, const float *x, const cu_mat *W, int n);
/* y = x * rsqrt(mean(x^2) + eps) * w per row of dim values (y may be x). */
void cu_rmsnorm(float *y, const float *x, const float *w, int rows, int dim, float eps);
/* x += y over n values */
void cu_add(float *x, const float *y, size_t n);
/* a = silu(a) * b over n values */
void cu_swiglu(float *a, const float *b, size_t n);
/* Per-head RMSNorm and NeoX rotary embedding of the first rot dims (position pos[t], frequencies
 * inv_freq [rot/2]) of n tokens' queries (Hq heads at q + t*ldq + h*ldh) and keys (Hkv heads of
 * hd at k + t*Hkv*hd); each token's normed key and its value v [n, Hkv*hd] are stored at cache
 * row slot0 + t of kc / vc [*, Hkv*hd]. */
void cu_qk_norm_rope(float *q, int ldq, int ldh, int Hq, float *k, const float *v, int Hkv, int hd, int rot,
                     const float *qnorm, const float *knorm, float eps, const int *pos, const float *inv_freq,
                     float *kc, float *vc, int slot0, int n);
/* Attention of n tokens (query heads as in cu_qk_norm_rope, GQA over Hkv cache heads) into out
 * [n, Hq*hd]. Token t sees the p0 committed cache rows and then depth[t] + 1 rows of its own
 * forward: anc [n, ld_anc] lists them (slot p0 + anc[t][d] holds the depth-d one); anc NULL: a
 * chain, token t sees rows 0 .. p0 + t. gated: out *= sigmoid(the second half of each query
 * head's rows). scores: scratch [n * Hq, ldsc >= p0 + n]. */
void cu_attention(float *out, const float *q, int ldq, int ldh, int Hq, int Hkv, int hd, const float *kc,
                  const float *vc, int p0, const int *anc, int ld_anc, const int *depth, int gated, float *scores,
                  int ldsc, int n);
/* Depthwise causal conv (K taps, w [C, K]) + SiLU of n tokens' rows qkv [n, C], in place. Chain
 * (parent NULL): the window win [K-1, C] (oldest first) enters with the inputs before token 0
 * and leaves with the last K-1 inputs. Tree: token t continues parent[t]'s window (win for the
 * root) and leaves its own at node_win + t*(K-1)*C; win is not changed. */
void cu_conv_silu(float *qkv, int C, int n, int K, const float *w, float *win, const int *parent, float *node_win);
/* L2-normalise q and k of each token's Hk key heads of dk (q also scaled by 1/sqrt(dk)). */
void cu_l2norm_qk(float *qkv, int C, int Hk, int dk, int n);
/* Gated DeltaNet recurrence of n tokens, value head per block, column per thread (docs/design.md):
 * qkv [n, C] normalised conv output (q | k | v), a and b [n, ld_ab] raw gate inputs, gates
 * g = neg_exp_A * softplus(a + dt_bias), beta = sigmoid(b). Chain: from S0 (NULL: S) into S
 * [Hv, dk, dv]. Tree: token t continues parent[t]'s state (S for the root) and leaves its own at
 * node_S + t*Hv*dk*dv; S is not changed. out [n, Hv*dv] or NULL (state only). dk in {16, 32, 64,
 * 128}: cu_gdn_supported. */
int cu_gdn_supported(int dk, int dv);
void cu_gdn(const float *qkv, int C, int Hk, int Hv, int dk, int dv, const float *a, const float *b, int ld_ab,
            const float *neg_exp_A, const float *dt_bias, float *S, const float *S0, float *out, int n,
            const int *parent, float *node_S);
/* z = silu(z) * (w * rmsnorm(o)) per row of dv values (the gated RMSNorm of a linear layer). */
void cu_gated_rmsnorm(float *z, const float *o, const float *w, int rows, int dv, float eps);
/* ids [rows] = the first index of each row's largest value (x [rows, V]); bad: += the rows'
 * non-finite values (a device counter). */
void cu_argmax(int32_t *ids, const float *x, int rows, int V, unsigned *bad);

/* Read n float4 values of buf and add them up into out[blockIdx]: the bandwidth probe. */
void cu_read_probe(const void *buf, size_t n4, float *out);

#ifdef __cplusplus
}
#endif

#endif
