/* dfl bench --parts profile: where a forward's time goes, by kind of kernel call (kn_prof). */
#ifndef DFL_BENCH_PROFILE_H
#define DFL_BENCH_PROFILE_H

#include "dfl/draft.h"
#include "dfl/kernels.h"
#include "dfl/model.h"

enum { BP_DECODE, BP_VERIFY, BP_TREE, BP_DRAFT, BP_COUNT }; /* the forwards profiled */
#define BP_TREE_BUDGET 64

typedef struct bench_prof {
    int n[BP_COUNT];                     /* tokens of each forward (0: not run) */
    double total_ms[BP_COUNT];           /* mean wall time of the forward */
    double op_ms[BP_COUNT][KN_OP_COUNT]; /* mean time per forward in each kind of call */
    double matmul_gbps[BP_COUNT];        /* weight bytes of the products / their time */
} bench_prof;

/* Random distributions over D depths of V tokens with one likely token per depth (trees both deep
 * and branching): [D, V], softmaxed; NULL when out of memory. */
float *bench_tree_probs(int D, int V);

/* reps forwards of each kind on s after its context: one decode step (kept, as decoding does),
 * a verification of nv tokens and, when s has a tree enabled, a tree of BP_TREE_BUDGET draft
 * nodes over B - 1 depths (each rolled back, or its root committed); with a drafter dif (NULL:
 * none) that holds the context, one block of B drafted. toks: at least nv tokens. */
int bench_profile_run(dfl_target_state *s, const dfl_draft_if *dif, const int32_t *toks, int nv, int B, int reps,
                      bench_prof *p);
void bench_profile_print(const bench_prof *p);
void bench_profile_json(const bench_prof *p);

#endif
