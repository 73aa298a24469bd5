/* The kernels' op profile (dfl/kernels.h, kn_prof_*): wall time of the outermost kernel calls by
 * kind, counted on the thread that calls them while counting is on. */
#include <omp.h>
#include <string.h>

#include "dfl/common.h"
#include "kn_internal.h"

int kn_prof_on;
static kn_prof counts;
static kn_op matmul_kind = KN_OP_MATMUL;
static _Thread_local int depth; /* kernel calls open on this thread: only the outermost counts */

static const char *const names[KN_OP_COUNT] = {"matrix products",       "lm_head",         "attention",
                                               "delta-rule recurrence", "conv, q/k norms", "norms, elementwise",
                                               "logits check"};
static const char *const keys[KN_OP_COUNT] = {"matmul", "lm_head",     "attention", "recurrence",
                                              "conv",   "elementwise", "logits"};

const char *kn_op_name(kn_op op) { return op >= 0 && op < KN_OP_COUNT ? names[op] : "?"; }
const char *kn_op_key(kn_op op) { return op >= 0 && op < KN_OP_COUNT ? keys[op] : "?"; }

void kn_prof_start(void) {
    memset(&counts, 0, sizeof counts);
    depth = 0;
    kn_prof_on = 1;
}

void kn_prof_stop(kn_prof *out) {
    kn_prof_on = 0;
    if (out) *out = counts;
}

kn_op kn_prof_matmul_as(kn_op op) {
    const kn_op old = matmul_kind;
    matmul_kind = op;
    return old;
}

double kn_prof_begin_(void) {
    if (omp_in_parallel()) return KN_PROF_SKIP;
    return depth++ ? KN_PROF_NESTED : dfl_now();
}

void kn_prof_end_(kn_op op, double t0, uint64_t bytes) {
    if (t0 == KN_PROF_SKIP) return;
    depth--;
    if (t0 == KN_PROF_NESTED) return;
    if (op == KN_OP_MATMUL) op = matmul_kind;
    counts.seconds[op] += dfl_now() - t0;
    counts.calls[op]++;
    if (op == KN_OP_MATMUL || op == KN_OP_LM_HEAD) counts.matmul_bytes += bytes;
}
