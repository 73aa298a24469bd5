/* Compute kernels. All activations are float32 (products with BF16 weights round them to bf16
 * only in the opt-in KN_ACT_BF16 mode); weight matrices may be F32, F16, BF16 or
 * block-quantized F8_E4M3 (dequantized in registers) and are read in place from the mmap.
 *
 * Instruction-set paths: every dispatched kernel (kn_matmul, kn_dot, kn_axpy, kn_swiglu,
 * kn_silu_inplace, kn_conv_silu, kn_gdn_*) has a generic C variant and x86-64 SIMD variants compiled with
 * target attributes, chosen at run time from the CPU's features (the binary runs on any
 * x86-64). DFL_ISA=generic|avx2|avx512|avx512bf16|amx forces a path (benchmarks, tests).
 * Within one path each output element is computed by the same operations whatever the batch
 * size n, so a forward over n tokens equals n single-token forwards bit for bit; different
 * paths agree up to rounding. */
#ifndef DFL_KERNELS_H
#define DFL_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "dfl/safetensors.h"

typedef enum kn_isa {
    KN_ISA_GENERIC,    /* portable C */
    KN_ISA_AVX2,       /* AVX2 + FMA + F16C */
    KN_ISA_AVX512,     /* AVX-512 F/BW/VL/DQ + FMA: float32 FMAs over converted weights */
    KN_ISA_AVX512BF16, /* AVX-512 BF16 dot products on BF16 weights, each activation split into
                        * three bf16 parts (hi + mid + lo, float32 accuracy); other dtypes as
                        * KN_ISA_AVX512 */
    KN_ISA_AMX,        /* AMX-BF16 tiles on BF16 weights (activations split as above; Linux grants
                        * the tile state per process); other dtypes and shapes as KN_ISA_AVX512 */
    KN_ISA_COUNT
} kn_isa;

/* 1 if this CPU (and OS) can run the path. */
int kn_isa_supported(kn_isa isa);
/* The default path: DFL_ISA when set (a name this CPU cannot run falls back to the automatic
 * choice, with a warning on stderr), else the first supported of amx, avx512, avx2, generic. */
kn_isa kn_isa_default(void);
/* The path the kernels use now (kn_isa_default() until kn_isa_set). */
kn_isa kn_isa_get(void);
/* Force a path; DFL_ERR (message set) when the CPU cannot run it. Call between kernels,
 * never while one runs. */
int kn_isa_set(kn_isa isa);
const char *kn_isa_name(kn_isa isa);
/* "generic" | "avx2" | "avx512" | "avx512bf16" | "amx" -> isa; DFL_ERR on other names. */
int kn_isa_parse(const char *name, kn_isa *out);

/* Activations of matrix products with BF16 weights. KN_ACT_F32 (the default) keeps them float32
 * (to within 2^-27 on the bf16 dot-product paths), so results match float32 references up to
 * summation order. KN_ACT_BF16 (opt-in, DFL_ACT=bf16 or --act bf16) rounds each activation to
 * bf16 once (round to nearest even, as torch) and takes one VDPBF16PS per 32 weights (on the
 * AMX path one TDPBF16PS column per token: a 16-token verification one instruction per weight
 * tile): about half the compute of float32 FMAs, a third of the three-part split, at the cost of
 * bf16 rounding of the inputs (accuracy in bench/README.md). It needs AVX-512 BF16. Other weight
 * dtypes and the other kernels are unchanged. Batch independence holds in both. */
typedef enum kn_act { KN_ACT_F32, KN_ACT_BF16, KN_ACT_COUNT } kn_act;
/* The mode now (DFL_ACT at start, else KN_ACT_F32). */
kn_act kn_act_get(void);
/* DFL_ERR (message set) when the CPU lacks AVX-512 BF16 for KN_ACT_BF16. Call between kernels. */
int kn_act_set(kn_act act);
const char *kn_act_name(kn_act act);
/* "f32" | "bf16" -> act; DFL_ERR on other names. */
int kn_act_parse(const char *name, kn_act *out);

/* A weight matrix W [rows, cols], row-major, y = W x. data is element-aligned (the loader
 * copies unaligned tensors into `owned`).
 * F8_E4M3 (fine-grained FP8): W[r][c] = st_f8e4m3_to_f32(data[r][c]) * scale[r / brow][c / bcol],
 * one float32 multiplier (the checkpoint's weight_scale_inv) per brow x bcol block, the last
 * blocks of a row or column cut short; the kernels dequantize in registers and accumulate in
 * float32, so y equals the product with the dequantized float32 matrix up to summation order. */
typedef struct dfl_mat {
    st_dtype dtype;
    const void *data;
    int rows, cols;
    void *owned;        /* memory the matrix owns (a private aligned copy of data, or scale) */
    const float *scale; /* F8_E4M3: [ceil(rows / brow), ceil(cols / bcol)] block multipliers */
    int brow, bcol;     /* F8_E4M3: block size (quantization_config.weight_block_size) */
} dfl_mat;

/* Below this many multiply-adds a kernel (or a model's loop) runs on the calling thread: a
 * parallel region costs more than the work (and much more when the cores are oversubscribed). */
#define KN_PAR_MIN_WORK ((size_t)1 << 17)

/* GOMP_SPINCOUNT that the CLI and the Python package give libgomp unless the user set
 * OMP_WAIT_POLICY or GOMP_SPINCOUNT: idle threads spin this many times at a barrier, then sleep,
 * so that on a loaded machine they yield their cores (docs/threads.md). */
#define DFL_GOMP_SPINCOUNT "3000"

/* The team of the kernels' parallel regions (docs/threads.md). By default it adapts: where the
 * threads wait for a core a sizeable share of the time (other processes on the machine), a trial
 * runs fewer threads for a moment and keeps them if they do as much work per second; a smaller
 * team tries one thread more the same way; failed trials back off (0.5 s to 8 s). Otherwise
 * omp_get_max_threads(): when OMP_NUM_THREADS is set, after kn_team_fix, or where
 * /proc/thread-self/schedstat cannot be read. Results never depend on the team.
 * kn_team: the team for a region about to do this much work (multiply-adds or elements: the
 * region's own estimate; call it outside parallel regions, in the num_threads clause);
 * kn_team_now: the current team. */
int kn_team(size_t work);
int kn_team_now(void);
/* Stop adapting: every region runs n threads from now on (dfl bench --threads), or
 * omp_get_max_threads() for n = 0. */
void kn_team_fix(int n);
typedef struct kn_team_stats {
    int adaptive, max, now, lowest; /* adapting?; the cap; the team now; the smallest so far */
    long shrinks, trials;           /* trials that took threads away, and kept them; all trials */
    double mean;                    /* the team size averaged over the time since the first region */
} kn_team_stats;
void kn_team_stats_get(kn_team_stats *s);

/* Where a forward's time goes (dfl bench --parts profile): while counting, each outermost call of
 * a kernel the model forwards make, from outside parallel regions, adds its wall time to its kind
 * (a product inside kn_matmul_multi counts once); products also add their weights' bytes.
 * Counting costs one flag test per call when off. */
typedef enum kn_op {
    KN_OP_MATMUL,     /* matrix products of the layers (kn_matmul, _multi, _jobs) */
    KN_OP_LM_HEAD,    /* products that model_lm_head tags (kn_prof_matmul_as) */
    KN_OP_ATTENTION,  /* kn_attention, q/k head norms with rope, rope tables */
    KN_OP_RECURRENCE, /* the Gated DeltaNet delta rule (kn_gdn_heads) */
    KN_OP_CONV,       /* causal convolution, its window, q/k l2 norms */
    KN_OP_ELEMENT,    /* RMS norms, residual adds, SwiGLU, expert routing and gathering */
    KN_OP_LOGITS,     /* the logits' finite check, argmax */
    KN_OP_COUNT
} kn_op;
typedef struct kn_prof {
    double seconds[KN_OP_COUNT];
    long calls[KN_OP_COUNT];
    uint64_t matmul_bytes; /* weight bytes of the products counted (both product kinds) */
} kn_prof;
/* Zero the counts and count from now on (the calling thread's kernel calls). */
void kn_prof_start(void);
/* Stop counting; *out (if not NULL) gets the counts since kn_prof_start. */
void kn_prof_stop(kn_prof *out);
/* The kind that matrix products count as from now on (KN_OP_MATMUL or KN_OP_LM_HEAD); returns
 * the previous one. */
kn_op kn_prof_matmul_as(kn_op op);
/* "matrix products", "lm_head", ... */
const char *kn_op_name(kn_op op);
/* A short name for JSON: "matmul", "lm_head", "attention", "recurrence", "conv", "elementwise",
 * "logits". */
const char *kn_op_key(kn_op op);

/* y[n][rows] = x[n][cols] . W^T — OpenMP-threaded over rows; each weight row is read once
 * for all n inputs (register tiles of rows x tokens, x blocked to stay in cache). */
void kn_matmul(float *y, const float *x, const dfl_mat *w, int n);
/* Each row's Euclidean norm of a matrix, computed on first use and kept (kn_matmul_argmax's
 * bound); one cache per matrix. */
typedef struct kn_row_norms kn_row_norms;
kn_row_norms *kn_row_norms_new(void);
void kn_row_norms_free(kn_row_norms *c);
/* Compute them now where kn_matmul_argmax over n tokens of W would (kn_argmax_estimates). */
void kn_row_norms_prepare(kn_row_norms *c, const dfl_mat *w, int n);
/* ids[t] = kn_argmax of row t of x . W^T (n tokens), the same id as the full product gives. y
 * [n][rows] is scratch; returns 1 where it holds the full product (then its values may be read,
 * non-finite ones included), 0 where the argmax was found without it. That happens where
 * kn_argmax_estimates says so: with float32 activations on the AMX path or where the CPU has
 * AVX-512 BF16, from KN_ARGMAX_MIN_TOKENS tokens on, every row is estimated with the
 * activations rounded to bf16 once (one dot product where float32 takes two FMAs or three
 * parts), and only the rows whose proven error bound reaches the best are computed in float32
 * (src/kernels/head_argmax.c). norms: the cache for W (NULL: the full product). */
#define KN_ARGMAX_MIN_TOKENS 6
/* How the current path estimates (float32 activations): AMX tiles with one part an activation,
 * VDPBF16PS (AVX-512 BF16, also under the float32 FMA path), or not at all. */
typedef enum kn_estimate { KN_EST_NONE, KN_EST_TILES, KN_EST_DP } kn_estimate;
kn_estimate kn_argmax_estimate_kind(void);
int kn_argmax_estimates(const dfl_mat *w, int n);
int kn_matmul_argmax(int32_t *ids, float *y, const float *x, const dfl_mat *w, int n, kn_row_norms *norms);
/* y[i] [n][w[i]->rows] = x [n][cols] . W_i^T for count matrices that share the input x (same
 * cols; q/k/v, gate/up): on the AMX path x is packed once and one parallel region covers every
 * matrix's rows. Each y[i] equals kn_matmul(y[i], x, w[i], n) bit for bit. */
void kn_matmul_multi(int count, float *const *y, const float *x, const dfl_mat *const *w, int n);
/* One product of a kn_matmul_jobs list: y [n][w->rows] = x [n][w->cols] . W^T. */
typedef struct kn_mm_job {
    float *y;
    const float *x;
    const dfl_mat *w;
    int n;
} kn_mm_job;
/* count products, each with its own input and batch (a mixture of experts' gate and up of every
 * touched expert and the shared expert, then their down), equal to kn_matmul(y, x, w, n) each,
 * bit for bit. Products of one dtype and width (outside the AMX path) run in one parallel region
 * whose threads claim row blocks of all of them dynamically: no barrier between products, and
 * products too small to split well over the threads still keep every thread streaming. A run of
 * consecutive jobs with the same x and n lays x out once. */
void kn_matmul_jobs(int count, const kn_mm_job *jobs);
/* One row of W as float32: out[cols]. */
void kn_mat_row(const dfl_mat *w, int row, float *out);

/* sum_i a[i] * b[i] over n floats. */
float kn_dot(const float *a, const float *b, int n);
/* y[i] += a * x[i] over n floats. */
void kn_axpy(float *y, float a, const float *x, int n);

/* Attention of G query rows over one cache head in one call each (one dispatch, each row of b
 * or x read once for the G rows, y kept in registers): for g < G,
 *   out[g*ldo + j] = kn_dot(a + g*lda, b + j*ldb, n) for j < m, and
 *   for j = 0..m-1 in order with w[g*ldw + j] != 0: kn_axpy(y + g*ldy, w[g*ldw + j], x + j*ldx, n).
 * Both equal those calls bit for bit, whatever G. */
void kn_dot_rows(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m, int n);
void kn_axpy_rows(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m, int n);

/* Attention of n query rows over a key/value cache (the target's layers, the drafter's block,
 * the MTP head). Rows come in blocks of `block`: row r sits at position qpos = starts[r/block]
 * + r%block and sees the context keys 0..starts[b]-1 then its block's keys (in the cache at
 * positions starts[b].. when kb/vb are NULL, else block b's at kb/vb + b*block*ldkv), only up to
 * itself when causal. Masked (-inf) besides: keys with qpos - j >= window (window > 0), and with
 * a tree, block key i unless tree[r*ldtree + i] (the row's ancestors and itself). Per (row, head
 * h): scores q.k * 1/sqrt(hd), softmax, sum of the weighted values (kn_dot_rows, kn_softmax,
 * kn_axpy_rows in key order), then out *= sigmoid(gate) when gated. GQA: query head h reads
 * key/value head h / (n_heads / n_kv_heads). Threaded over (row, head group); each output is
 * computed by the same operations whatever the threads or the batch. */
typedef struct kn_attn_io {
    int n, n_heads, n_kv_heads, head_dim;
    const float *q; /* query of (r, h) at q + r*ldq + h*ldqh [head_dim] */
    size_t ldq, ldqh;
    const float *gate;                  /* NULL, or the output gate of (r, h) at gate + r*ldq + h*ldqh [head_dim] */
    float *out;                         /* [n][n_heads * head_dim] */
    const float *k, *v;                 /* cache: key/value head g of position j at k + j*ldkv + g*head_dim */
    const float *const *kc, *const *vc; /* NULL, or [n / block] each block's own cache (k, v unused):
                                         * blocks drafted on different contexts in one forward */
    const float *kb, *vb;               /* NULL, or the blocks' own keys/values [n][ldkv] */
    size_t ldkv;
    int block;         /* rows per block (n for a plain causal batch) */
    const int *starts; /* [n / block] first position of each block */
    int causal, window;
    const unsigned char *tree; /* NULL, or [n][ldtree] visibility of the block's keys */
    size_t ldtree;
    float *scores; /* scratch [omp threads][n_heads / n_kv_heads][ldsc] */
    size_t ldsc;   /* >= starts[b] + block for every block */
} kn_attn_io;
void kn_attention(const kn_attn_io *a);

/* y = x * rsqrt(mean(x^2) + eps) * w  (w already holds the effective multiplier). */
void kn_rmsnorm(float *y, const float *x, const float *w, int n, float eps);
/* kn_rmsnorm of each of rows rows of x [rows][dim] into y, threaded over rows. */
void kn_rmsnorm_rows(float *y, const float *x, const float *w, int rows, int dim, float eps);
/* kn_swiglu over n elements, threaded over chunks (equal to one kn_swiglu call bit for bit). */
void kn_swiglu_par(float *a, const float *b, size_t n);
/* The residual add x[i] += y[i] over n elements, threaded. */
void kn_add(float *x, const float *y, size_t n);
/* x[i] += a * y[i] (a product then a sum, unlike kn_axpy's fused multiply-add on SIMD paths). */
void kn_add_scaled(float *x, float a, const float *y, int n);
/* The weighted gather of a mixture of experts: out [n][H], row t = sum over j < k, in order, of
 * w[t*k+j] * y[rows[t*k+j]] (y [*][H]); threaded over t. */
void kn_gather_sum(float *out, const float *y, const int *rows, const float *w, int n, int k, int H);
/* Mixture-of-experts router of one token (transformers' TopKRouter): p [E] (logits in,
 * overwritten) = softmax, the k largest (the lower id first on ties) into idx [k] / w [k],
 * divided by their sum when norm, then listed by ascending expert id. */
void kn_moe_route(float *p, int E, int k, int norm, int *idx, float *w);
/* The grouped depthwise convolution of a DFlash2 sublayer (docs/dflash2.md) over B rows x [B][H]:
 * y[i][c] = sum over taps t <= i, t < T, in order, of (base[t][c] + delta[i][t][c / gs]) * x[i-t][c];
 * base [T][H], row i's deltas [T][H/gs] at delta + i*ldd. y must not alias x. */
void kn_conv_grouped(float *y, const float *x, const float *base, const float *delta, size_t ldd, int B, int H, int T,
                     int gs);
/* The K largest values of row [V] into ids / vals [K], value descending, ties by the lower id
 * (a NaN is never taken). */
void kn_topk_values(const float *row, int V, int K, int32_t *ids, float *vals);
/* Log-probabilities of row [V] (log-softmax, the normalizer summed in double): the k most
 * probable tokens into ids / lp [k], most probable first (ties: the lower id); returns the
 * log-normalizer, so token t's log-probability is row[t] - it. */
double kn_logsoftmax_top(const float *row, int V, int k, int32_t *ids, float *lp);
/* x[i] *= y[i]. */
void kn_mul(float *x, const float *y, int n);
/* x[i] = v. */
void kn_fill(float *x, float v, size_t n);
/* x[i] *= a. */
void kn_scale(float *x, float a, size_t n);
/* Logit soft-capping: x[i] = tanh(x[i] / cap) * cap. */
void kn_softcap(float *x, float cap, size_t n);
/* Rotary tables at position pos: cos[i] = cos(pos * inv_freq[i]), sin likewise, i < half. */
void kn_rope_table(float *cos, float *sin, const float *inv_freq, int half, float pos);
/* Per-head RMSNorm (weights w [hd]) then kn_rope, in place, over nh heads of x spaced ldh apart
 * (the q/k norm and rotation of an attention layer). */
void kn_head_norm_rope(float *x, int nh, size_t ldh, const float *w, int hd, float eps, const float *cos,
                       const float *sin, int rot);
/* L2 normalisation of nh heads of d values in each of n rows of x (row stride ld), times scale:
 * v = v * (1 / sqrt(sum v^2 + 1e-6)) * scale; threaded over (row, head). */
void kn_l2norm_heads(float *x, size_t ld, int n, int nh, int d, float scale);
/* In-place SiLU-gated product: a[i] = silu(a[i]) * b[i]. */
void kn_swiglu(float *a, const float *b, int n);
/* In-place SiLU: x[i] = x[i] / (1 + exp(-x[i])). */
void kn_silu_inplace(float *x, int n);
/* Depthwise causal convolution, then SiLU, of nc <= 16 channels over n tokens, in place:
 * x[t ld + i] = silu(wt[K-1][i] x[t ld + i] + sum_{j < K-1} wt[j][i] win[j][i]), win holding the
 * K-1 inputs before token t (oldest first). win [K-1][16] enters with the inputs before token 0
 * and leaves with the last K-1 inputs; wt [K][16]; 1 <= K <= 16. */
void kn_conv_silu(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win);
/* kn_conv_silu of n tokens of C channels (rows ld apart), each token with its own window: token t's
 * K-1 inputs before it (oldest first) are the rows src[t (K-1) + j] (C floats each); wt
 * [ceil(C / 16)][K][16] holds each 16 channels' weights as kn_conv_silu takes them. The same bits
 * as kn_conv_silu of each token and 16 channels with that window (a tree's nodes, each over its
 * ancestors). */
void kn_conv_silu_rows(float *x, size_t ld, int n, int C, int K, const float *wt, const float *const *src);
/* A linear layer's depthwise causal convolution and SiLU over n tokens of x [n][C] in place
 * (kn_conv_silu, 16 channels at a time, threaded over them): weights w [C][K], w[c][K-1] on the
 * current token. Chain (parent NULL): the window state [K-1][C] enters with the inputs before
 * token 0 and leaves with the last K-1. Tree (parent[t] < t, -1 for the root): node t's window
 * holds the inputs of its K-1 nearest ancestors, then the newest of state's; state is left
 * alone and the inputs are kept in xin [n][C] (kn_conv_window gives a path's window from them). */
void kn_causal_conv_silu(float *x, int n, int C, int K, const float *w, float *state, const int *parent, float *xin);
/* The window after the last node of a tree path path[0..len-1] (root first), into win [K-1][C]:
 * the last K-1 of the inputs of state [K-1][C] followed by the path's inputs xin [node][C]
 * (win may be state). */
void kn_conv_window(float *win, const float *state, const float *xin, const int *path, int len, int C, int K);
/* NeoX half-split rotary embedding over the first rot dims of x[hd] (cos/sin [rot/2]). */
void kn_rope(float *x, const float *cos, const float *sin, int rot);
/* In-place softmax over n values: x - max through expf, summed in index order, times 1 / sum
 * (the same bits on every path). */
void kn_softmax(float *x, int n);
/* The first i < n with x[i] > t, else n (a top-K scan skips what cannot enter). */
int kn_first_above(const float *x, int n, float t);
/* Index of the largest value (first on ties). */
int kn_argmax(const float *x, int n);
/* NaN and Inf values in x [n] (exponent bits all set; an integer test the compiler vectorizes). */
size_t kn_count_nonfinite(const float *x, size_t n);

/* The multiply-add rate, on the calling thread, of the instruction at the heart of BF16 matrix
 * products on the current path and activation mode (AVX-512: float32 FMA on zmm, 16 per
 * instruction; bf16 activations: VDPBF16PS on zmm, 32; avx512bf16 with float32 activations:
 * VDPBF16PS over three parts, 32 / 3; AVX2: FMA on ymm, 8; generic: scalar fmaf; AMX:
 * TDPBF16PS, 16 x 16 x 32 over 3 parts or 1 with bf16 activations, on 4 independent C tiles):
 * 12 independent chains (AMX: instructions) for iters rounds. Matrix
 * multiply-adds per second; *what names the instruction. A ceiling for the matmul tiles, which
 * also load, convert and reduce (dfl bench --parts peak). */
double kn_peak_macs(long iters, const char **what);
/* The rate of the same instruction as the products of many tokens run it, where that differs
 * from the peak above: on AMX, TDPBF16PS with a weight tile and six B tiles loaded each step
 * from the caches (amx_passes over weights in cache; about 12 x iters instructions). 0 and
 * *what NULL on the other paths (not measured there). */
double kn_peak_macs_loaded(long iters, const char **what);
/* The rate of kn_matmul_argmax's estimate where the path has one (kn_argmax_estimate_kind): the
 * instruction of kn_peak_macs with every activation one bf16 part (AMX: TDPBF16PS, 16 x 16 x 32;
 * else VDPBF16PS on zmm, 32). 0 and *what NULL elsewhere. */
double kn_peak_macs_estimate(long iters, const char **what);

/* ---- Gated DeltaNet core, one value head (docs/design.md §3) -------------------------- */

/* Tokens per chunk of kn_gdn_chunked. */
#define KN_GDN_CHUNK 64

/* Inputs of one value head over n tokens: token t reads q + t*ld and k + t*ld [dk] (already
 * L2-normalised, q scaled by 1/sqrt(dk)), v + t*ld [dv], log-decay g[t] <= 0 and beta[t]. */
typedef struct kn_gdn_io {
    int dk, dv, n;
    const float *q, *k, *v;
    size_t ld;
    const float *g, *beta;
    float *out; /* o_t at out + t*ldo [dv], or NULL (state only) */
    size_t ldo;
    const float *S0; /* state [dk][dv] to start from, left unchanged (NULL: S itself); a tree
                      * node continues its parent's state without copying it first */
    int no_state;    /* kn_gdn_recurrent of one token: S is not written, only out (a tree's leaf,
                      * whose state nothing continues); the same out bit for bit */
} kn_gdn_io;

/* Gates of value head h for tokens t0..t0+nt-1 (nt <= KN_GDN_CHUNK) from ab [tokens][2*Hv] (raw
 * a | b projections) into gb [2*KN_GDN_CHUNK]: log-decays neg_exp_A[h] * softplus(a + dt_bias[h])
 * then betas sigmoid(b) from gb + KN_GDN_CHUNK. */
void kn_gdn_gates(float *gb, const float *ab, int Hv, int h, int t0, int nt, const float *neg_exp_A,
                  const float *dt_bias);

/* Token-by-token recurrence on the state S [dk][dv]:
 *   S *= exp(g_t); d = (v_t - S^T k_t) beta_t; S += k_t d^T; o_t = S^T q_t. */
void kn_gdn_recurrent(float *S, const kn_gdn_io *io);
/* The same function computed by chunks of KN_GDN_CHUNK tokens in the WY/UT form (per chunk:
 * cumulative decays, the unit lower-triangular system for the deltas solved by forward
 * substitution, intra-chunk attention, one state update). Equal to kn_gdn_recurrent up to
 * rounding. Without memory for its scratch (~0.1 MB) it runs kn_gdn_recurrent. */
void kn_gdn_chunked(float *S, const kn_gdn_io *io);

/* Tree layout of a linear layer's pass: node i continues the state of its parent (the layer's
 * state S, unchanged, for the root). The nodes run in depth-first order, so that a node's parent
 * is the last node run one level up: each thread keeps the state of the last node at each depth
 * in its own stack, which stays in cache, and no node's state is kept after the pass (the
 * committed path's is recomputed: target_state_tree_commit). */
typedef struct kn_gdn_tree {
    const int *order; /* [n] the nodes in depth-first preorder (node 0, the root, first) */
    const int *depth; /* [n] each node's depth, the root's 0 */
    float *stack;     /* [threads][levels][dk][dv] */
    int levels;       /* states per thread: more than the deepest node's depth */
    int threads;      /* threads the stack has room for: the pass runs on at most as many */
} kn_gdn_tree;

/* One Gated DeltaNet layer's heads over n tokens: value head h (key head h / (Hv/Hk)) runs
 * kn_gdn_chunked (chunked) or kn_gdn_recurrent on S + h*dk*dv, a chain up to KN_GDN_CHUNK tokens
 * per call (S0: the chain's state to start from, left unchanged; NULL: S itself), a tree node by
 * node. Threaded over heads. */
typedef struct kn_gdn_heads_io {
    int n, Hk, Hv, dk, dv;
    const float *qkv; /* token t: q [Hk][dk] | k [Hk][dk] | v [Hv][dv] at qkv + t*ld (q, k normalised) */
    size_t ld;
    const float *ab;                  /* [n][2*Hv] raw a | b projections (kn_gdn_gates) */
    const float *neg_exp_A, *dt_bias; /* [Hv] */
    float *S;                         /* [Hv][dk][dv] */
    const float *S0;                  /* chain only: [Hv][dk][dv] or NULL */
    float *out;                       /* [n][Hv*dv] or NULL (state only) */
    int chunked;
    const kn_gdn_tree *tree; /* NULL: a chain */
} kn_gdn_heads_io;
void kn_gdn_heads(const kn_gdn_heads_io *a);

static inline float kn_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float kn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float kn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#endif
