/* Internal: tensor binding helpers used by the target and drafter loaders. */
#ifndef DFL_MODELS_LOADER_H
#define DFL_MODELS_LOADER_H

#include "dfl/kernels.h"
#include "dfl/safetensors.h"

typedef struct ld_ctx {
    const st_model *st;
    const char *where;      /* checkpoint directory, for messages */
    unsigned char *used;    /* [n_tensors] marks, or NULL */
    int check_weights;      /* scan for NaN/Inf */
} ld_ctx;

/* Find a tensor with exactly this shape and a supported dtype; marks it used. NULL + error. */
const st_tensor *ld_tensor(ld_ctx *c, const char *name, int nd, const int64_t *shape);
/* Bind a [rows, cols] matrix (zero-copy when element-aligned). */
int ld_mat(ld_ctx *c, const char *name, int rows, int cols, dfl_mat *out);
/* Read a small tensor as float32 (malloc'd), adding `add` to every element. */
float *ld_vec(ld_ctx *c, const char *name, int nd, const int64_t *shape, float add);
float *ld_vec1(ld_ctx *c, const char *name, int n, float add);
void ld_mat_free(dfl_mat *m);

#endif
