/* dfl bench --parts products: the matrix products of each weight shape over the token counts a
 * speculative round uses, the weights read as a forward reads them. */
#ifndef DFL_BENCH_PRODUCTS_H
#define DFL_BENCH_PRODUCTS_H

#include "dfl/model.h"

enum { BPR_NS = 6, BPR_MAX_SHAPES = 24 };
/* Token counts timed: decode, two interleaved B tiles, a 16-token verification, trees of 16, 32
 * and 64 draft nodes. */
extern const int bench_products_ns[BPR_NS];

typedef struct bench_shape {
    int rows, cols;
    st_dtype dtype;
    int count;         /* matrices of this shape in the model */
    double ms[BPR_NS]; /* mean time of one product of n tokens */
} bench_shape;

typedef struct bench_products {
    int n_shapes;
    bench_shape shape[BPR_MAX_SHAPES]; /* in the order the forward first reads them */
    double sweep_ms[BPR_NS];           /* one product of every matrix, as one forward's products */
    uint64_t bytes;                    /* weight bytes of one sweep */
    int experts_left_out;              /* routed experts' matrices not timed (MoE) */
} bench_products;

/* reps sweeps (after one that warms up) per token count over every matrix the forward reads
 * (the layers in order, then the lm_head; routed experts left out: their token counts depend on
 * the routing), each product timed alone, with random activations. */
int bench_products_run(const dfl_model *m, int reps, bench_products *p);
void bench_products_print(const bench_products *p);
void bench_products_json(const bench_products *p);

#endif
