/* dfl bench --parts products (bench_products.h).
 *
 * Each product is timed alone, but the products run in the forward's order over every matrix,
 * so that each one's weights come from where a forward finds them: from memory when the model
 * outgrows the caches. Timing one matrix again and again would keep it in L3 (480 MB on some
 * servers) and report speeds no forward sees. */
#include "cli/bench_products.h"

#include <stdio.h>
#include <stdlib.h>

#include "dfl/common.h"

const int bench_products_ns[BPR_NS] = {1, 6, 16, 17, 33, 65};

/* The present ones of ws[0..count-1] after mats[0..*n-1] (at most max). */
static void add_mats(const dfl_mat **mats, int *n, int max, const dfl_mat *const *ws, int count) {
    for (int i = 0; i < count; i++)
        if (ws[i]->data && ws[i]->rows > 0 && *n < max) mats[(*n)++] = ws[i];
}

/* The matrices a forward reads, in its order (routed experts left out), into mats[0..max-1];
 * returns their count, *experts the routed experts' matrices left out. */
static int collect_mats(const dfl_model *m, const dfl_mat **mats, int max, int *experts) {
    int n = 0;
    *experts = 0;
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const dfl_layer_w *l = &m->layers[i];
        if (l->type == DFL_LAYER_LINEAR)
            add_mats(mats, &n, max, (const dfl_mat *[]){&l->in_qkv, &l->in_z, &l->in_b, &l->in_a, &l->out_proj}, 5);
        else add_mats(mats, &n, max, (const dfl_mat *[]){&l->q_proj, &l->k_proj, &l->v_proj, &l->o_proj}, 4);
        if (l->moe) {
            add_mats(mats, &n, max, (const dfl_mat *[]){&l->router, &l->sh_gate, &l->sh_up, &l->sh_down, &l->sh_score},
                     5);
            *experts += 3 * m->cfg.n_experts;
        } else {
            add_mats(mats, &n, max, (const dfl_mat *[]){&l->gate, &l->up, &l->down}, 3);
        }
    }
    add_mats(mats, &n, max, (const dfl_mat *[]){&m->lm_head}, 1);
    return n;
}

static int shape_of(bench_products *p, const dfl_mat *w) {
    for (int s = 0; s < p->n_shapes; s++)
        if (p->shape[s].rows == w->rows && p->shape[s].cols == w->cols && p->shape[s].dtype == w->dtype) return s;
    if (p->n_shapes == BPR_MAX_SHAPES) return -1;
    p->shape[p->n_shapes] = (bench_shape){.rows = w->rows, .cols = w->cols, .dtype = w->dtype};
    return p->n_shapes++;
}

/* reps timed sweeps (after one that warms up) per token count over mats[0..nm-1], each
 * product's time into its shape sh[i]; x: activations of up to the largest n tokens. */
static void time_sweeps(bench_products *p, const dfl_mat **mats, const int *sh, int nm, const float *x, float *y,
                        int reps) {
    for (int k = 0; k < BPR_NS; k++) {
        const int n = bench_products_ns[k];
        for (int rep = 0; rep < reps + 1; rep++) {
            const double t_sweep = dfl_now();
            for (int i = 0; i < nm; i++) {
                const double t0 = dfl_now();
                kn_matmul(y, x, mats[i], n);
                if (rep) p->shape[sh[i]].ms[k] += 1e3 * (dfl_now() - t0);
            }
            if (rep) p->sweep_ms[k] += 1e3 * (dfl_now() - t_sweep) / reps;
        }
        for (int s = 0; s < p->n_shapes; s++) p->shape[s].ms[k] /= (double)reps * p->shape[s].count;
    }
}

int bench_products_run(const dfl_model *m, int reps, bench_products *p) {
    *p = (bench_products){0};
    const int max = 16 * m->cfg.n_layers + 1, N = bench_products_ns[BPR_NS - 1];
    const dfl_mat **mats = malloc((size_t)max * sizeof *mats);
    int *sh = malloc((size_t)max * sizeof *sh), rows = 1, cols = 1, nm = 0, rc = DFL_OK;
    if (!mats || !sh) rc = dfl_seterr("out of memory for the products' list");
    else nm = collect_mats(m, mats, max, &p->experts_left_out);
    for (int i = 0; rc == DFL_OK && i < nm; i++) {
        if ((sh[i] = shape_of(p, mats[i])) < 0) {
            rc = dfl_seterr("products: more than %d weight shapes", BPR_MAX_SHAPES);
            break;
        }
        p->shape[sh[i]].count++;
        p->bytes += (uint64_t)mats[i]->rows * mats[i]->cols * st_dtype_size(mats[i]->dtype);
        rows = mats[i]->rows > rows ? mats[i]->rows : rows;
        cols = mats[i]->cols > cols ? mats[i]->cols : cols;
    }
    float *x = rc == DFL_OK ? malloc((size_t)N * cols * sizeof(float)) : NULL,
          *y = rc == DFL_OK ? malloc((size_t)N * rows * sizeof(float)) : NULL;
    if (rc == DFL_OK && (!x || !y)) rc = dfl_seterr("out of memory for the products' activations");
    if (rc == DFL_OK) {
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < (size_t)N * cols; i++) { /* activations of an RMS-normed scale, in [-2, 2) */
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            x[i] = 4.0f * (float)(r >> 40) / (float)(1 << 24) - 2.0f;
        }
        time_sweeps(p, mats, sh, nm, x, y, reps);
    }
    free(mats), free(sh), free(x), free(y);
    return rc;
}

void bench_products_print(const bench_products *p) {
    printf("products   ms per product of n tokens, every matrix of the forward in its order (weights read\n"
           "           as a forward reads them); x1: against one token\n");
    printf("           %-22s %5s %8s", "shape", "count", "MB");
    for (int k = 0; k < BPR_NS; k++) printf("  n=%-5d", bench_products_ns[k]);
    printf("   x1 at n=16   n=65\n");
    for (int s = 0; s <= p->n_shapes; s++) {
        const int all = s == p->n_shapes;
        const bench_shape *b = &p->shape[all ? 0 : s];
        char name[48] = "all, in order";
        if (!all) snprintf(name, sizeof name, "[%d, %d] %s", b->rows, b->cols, st_dtype_name(b->dtype));
        const double *ms = all ? p->sweep_ms : b->ms;
        const double mb = all ? p->bytes / 1e6 : (double)b->rows * b->cols * st_dtype_size(b->dtype) / 1e6;
        int count = b->count;
        for (int t = 0; all && t < p->n_shapes; t++) count += t ? p->shape[t].count : 0;
        printf("           %-22s %5d %8.1f", name, count, mb);
        for (int k = 0; k < BPR_NS; k++) printf("  %7.3f", ms[k]);
        printf("   %9.2f  %5.2f\n", ms[2] / ms[0], ms[BPR_NS - 1] / ms[0]);
    }
    if (p->experts_left_out)
        printf("           (%d routed experts' matrices left out: their token counts follow the routing)\n",
               p->experts_left_out);
}

void bench_products_json(const bench_products *p) {
    printf(", \"products\": {\"tokens\": [");
    for (int k = 0; k < BPR_NS; k++) printf("%s%d", k ? ", " : "", bench_products_ns[k]);
    printf("], \"sweep_ms\": [");
    for (int k = 0; k < BPR_NS; k++) printf("%s%.6f", k ? ", " : "", p->sweep_ms[k]);
    printf("], \"bytes\": %llu, \"experts_left_out\": %d, \"shapes\": [", (unsigned long long)p->bytes,
           p->experts_left_out);
    for (int s = 0; s < p->n_shapes; s++) {
        const bench_shape *b = &p->shape[s];
        printf("%s{\"rows\": %d, \"cols\": %d, \"dtype\": \"%s\", \"count\": %d, \"ms\": [", s ? ", " : "", b->rows,
               b->cols, st_dtype_name(b->dtype), b->count);
        for (int k = 0; k < BPR_NS; k++) printf("%s%.6f", k ? ", " : "", b->ms[k]);
        printf("]}");
    }
    printf("]}");
}
