/* Kernel variants behind the public names of dfl/kernels.h (one per instruction-set path). */
#ifndef DFL_KN_INTERNAL_H
#define DFL_KN_INTERNAL_H

#include <omp.h>

#include "dfl/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#define KN_X86 1
#else
#define KN_X86 0
#endif

/* Iterations per claim of a schedule(dynamic, ...) loop of n iterations: about a quarter of a
 * thread's share, at least 1. The kernels' parallel loops hand out their work dynamically, so that
 * a thread the OS preempts for another process (a shared machine) leaves its rest to the others
 * instead of every thread waiting for its static share at the end of the loop; every iteration
 * computes the same bits whichever thread runs it. */
static inline int kn_chunk(long n) {
    const long c = n / (4L * (omp_in_parallel() ? omp_get_num_threads() : kn_team_now()));
    return c > 0 ? (int)c : 1;
}

/* The op profile (prof.c): a kernel entry point takes t0 = KN_PROF_BEGIN() on entry and calls
 * KN_PROF_END(kind, t0, weight bytes) before it returns. */
extern int kn_prof_on;
#define KN_PROF_SKIP (-2.0)   /* not counting (off, or inside a parallel region) */
#define KN_PROF_NESTED (-1.0) /* inside another counted call */
double kn_prof_begin_(void);
void kn_prof_end_(kn_op op, double t0, uint64_t bytes);
#define KN_PROF_BEGIN() (kn_prof_on ? kn_prof_begin_() : KN_PROF_SKIP)
#define KN_PROF_END(op, t0, bytes)                                   \
    do {                                                             \
        if ((t0) != KN_PROF_SKIP) kn_prof_end_((op), (t0), (bytes)); \
    } while (0)

/* The adaptive team's decision (threads.c), apart for tests. A window of dt seconds at time now
 * did this much work (the regions' estimates) while the team's threads ran and waited for a core
 * these thread-seconds; returns the team for the next window. */
typedef struct kn_team_ctl {
    int team, max;
    int trial;                    /* 0, or a trial's window: 1 on the other team, 2 back on team */
    int other;                    /* the trial's team */
    double rate_before;           /* work per second: the window before the trial */
    double rate_other;            /* and the trial's window */
    double next_fewer, next_more; /* no trial in that direction before */
    double wait_fewer, wait_more; /* the back-off of each direction */
    long shrinks, trials;         /* trials kept that took threads away; trials */
} kn_team_ctl;
int kn_team_step(kn_team_ctl *c, double now, double work, double dt, double run, double wait);

void kn_matmul_generic(float *y, const float *x, const dfl_mat *w, int n);
int kn_argmax_generic(const float *x, int n);
size_t kn_count_nonfinite_generic(const float *x, size_t n);
void kn_softmax_generic(float *x, int n);
int kn_first_above_generic(const float *x, int n, float t);
void kn_swiglu_generic(float *a, const float *b, int n);
void kn_silu_inplace_generic(float *x, int n);
void kn_conv_silu_generic(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win);
/* The block multipliers of row r of an F8_E4M3 matrix: [ceil(cols / bcol)]. */
static inline const float *kn_f8_scale_row(const dfl_mat *w, int r) {
    return w->scale + (size_t)(r / w->brow) * (size_t)((w->cols + w->bcol - 1) / w->bcol);
}
float kn_dot_generic(const float *a, const float *b, int n);
void kn_axpy_generic(float *y, float a, const float *x, int n);
void kn_dot_rows_generic(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m,
                         int n);
void kn_axpy_rows_generic(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m,
                          int n);
void kn_gdn_recurrent_generic(float *S, const kn_gdn_io *io);
void kn_gdn_chunk_generic(float *S, const kn_gdn_io *io, float *work);

#if KN_X86
/* count products of one dtype and width (kn_matmul_jobs), each equal to a call on its job alone
 * bit for bit, in one parallel region. */
void kn_matmul_avx2(int count, const kn_mm_job *j);
void kn_matmul_avx512(int count, const kn_mm_job *j);
/* BF16 weights only (the dispatcher sends other dtypes to kn_matmul_avx512). */
void kn_matmul_avx512bf16(int count, const kn_mm_job *j);
/* BF16 weights only, KN_ACT_BF16: each activation rounded to bf16 once (VDPBF16PS). */
void kn_matmul_bf16act(int count, const kn_mm_job *j);
#if defined(__linux__)
/* AMX path: up to KN_AMX_JOBS_MAX BF16 matrices of one width (cols % 32 == 0), y[i] = x[i] . w[i]^T
 * over n tokens each, in one parallel region; consecutive equal x[i] are packed once (other
 * dtypes and shapes: kn_matmul_avx512, or the VDPBF16PS kernel with bf16 activations). */
#define KN_AMX_JOBS_MAX 32
void kn_matmul_amx_multi(int count, float *const *y, const float *const *x, const dfl_mat *const *w, int n);
/* One product on the AMX path with every activation rounded to bf16 once, whatever kn_act_get()
 * says (kn_matmul_argmax's estimate). */
void kn_matmul_amx_bf16(float *y, const float *x, const dfl_mat *w, int n);
/* Ask Linux for the AMX tile state for this process; 1 when granted. */
int kn_amx_request(void);
/* kn_peak_macs's AMX loop: 12 x iters TDPBF16PS (16 x 16 x 32 multiply-adds each) on 4
 * independent C tiles, the instruction kn_matmul_amx_multi's tiles run; a C element. */
float kn_peak_amx(long iters);
/* kn_peak_macs_loaded's loop: calls x 192 TDPBF16PS as amx_passes runs them (a weight tile and
 * six B tiles loaded a step, the B tiles from L2); 0 without memory for its tiles. */
float kn_peak_amx_loaded(long calls);
/* The weight bytes of a call from which long batches of wide matrices run in WIDE_TOK-token
 * blocks (default 32 MiB; tests lower it to reach that path on small matrices); returns the
 * previous value. */
size_t kn_amx_wide_min(size_t bytes);
#endif
/* kn_peak_macs's loops: 12 chains x iters instructions; the sum of the chains (kept observable). */
float kn_peak_fma512(long iters);
float kn_peak_dp512(long iters);
float kn_peak_fma256(long iters);
void kn_silu_inplace_avx2(float *x, int n);
void kn_silu_inplace_avx512(float *x, int n);
void kn_conv_silu_avx2(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win);
void kn_conv_silu_avx512(float *x, size_t ld, int n, int nc, int K, const float *wt, float *win);
void kn_conv_silu_rows_avx512(float *x, size_t ld, int n, int C, int K, const float *wt, const float *const *src);
void kn_swiglu_avx2(float *a, const float *b, int n);
void kn_swiglu_avx512(float *a, const float *b, int n);
float kn_dot_avx2(const float *a, const float *b, int n);
float kn_dot_avx512(const float *a, const float *b, int n);
/* kn_softmax_generic's result bit for bit (softmax_x86.c), valid only where
 * kn_softmax_avx512_exact(): its expf equals this process's libm expf (checked once). */
void kn_softmax_avx512(float *x, int n);
int kn_softmax_avx512_exact(void);
/* y = expf(x) [n] as libm computes it where kn_softmax_avx512_exact() (for tests). */
void kn_expf_avx512(float *y, const float *x, int n);
int kn_first_above_avx512(const float *x, int n, float t);
/* kn_argmax_generic's index exactly (the first maximum; NaNs never win; x[0] NaN gives 0). */
int kn_argmax_avx512(const float *x, int n);
size_t kn_count_nonfinite_avx512(const float *x, size_t n);
void kn_axpy_avx2(float *y, float a, const float *x, int n);
void kn_axpy_avx512(float *y, float a, const float *x, int n);
void kn_dot_rows_avx2(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m,
                      int n);
void kn_dot_rows_avx512(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb, int m,
                        int n);
void kn_axpy_rows_avx2(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m,
                       int n);
void kn_axpy_rows_avx512(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx, int m,
                         int n);
/* SIMD Gated DeltaNet variants need dk and dv multiples of 8 (avx2) or 16 (avx512). */
void kn_gdn_recurrent_avx2(float *S, const kn_gdn_io *io);
void kn_gdn_recurrent_avx512(float *S, const kn_gdn_io *io);
void kn_gdn_chunk_avx2(float *S, const kn_gdn_io *io, float *work);
void kn_gdn_chunk_avx512(float *S, const kn_gdn_io *io, float *work);
#endif

/* Floats of scratch one chunk of kn_gdn_chunked needs. */
size_t kn_gdn_chunk_work(int dk, int dv);

#endif
