/* Checkpoint loading shared by targets and drafters: tensor lookup with dtype and shape
 * checks, alignment-safe views, small vectors converted to float32. */
#include "models/loader.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"

static int check_dtype(const char *where, const st_tensor *t) {
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return dfl_seterr("%s: tensor '%s' has dtype %s; supported: F32, F16, BF16", where, t->name,
                          st_dtype_name(t->dtype));
    return DFL_OK;
}

static void shape_str(const int64_t *shape, int nd, char *buf, size_t len) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (int i = 0; i < nd && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

const st_tensor *ld_tensor(ld_ctx *c, const char *name, int nd, const int64_t *shape) {
    char want[128];
    shape_str(shape, nd, want, sizeof want);
    const st_tensor *t = st_find(c->st, name);
    if (!t) {
        dfl_seterr("%s: missing tensor '%s' (expected shape %s)", c->where, name, want);
        return NULL;
    }
    int ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[128];
        shape_str(t->shape, t->ndim, got, sizeof got);
        dfl_seterr("%s: tensor '%s' has shape %s, expected %s", c->where, name, got, want);
        return NULL;
    }
    if (check_dtype(c->where, t) != DFL_OK) return NULL;
    if (c->used) c->used[t - c->st->tensors] = 1;
    if (c->check_weights) {
        for (int64_t i = 0; i < t->numel; i++) {
            float v;
            st_read_f32(t, i, 1, &v);
            if (!isfinite(v)) {
                dfl_seterr("%s: tensor '%s' holds a non-finite value (%g) at element %lld", c->where, name, v,
                           (long long)i);
                return NULL;
            }
        }
    }
    return t;
}

int ld_mat(ld_ctx *c, const char *name, int rows, int cols, dfl_mat *out) {
    const int64_t shape[2] = {rows, cols};
    const st_tensor *t = ld_tensor(c, name, 2, shape);
    if (!t) return DFL_ERR;
    out->dtype = t->dtype;
    out->rows = rows;
    out->cols = cols;
    out->owned = NULL;
    size_t es = st_dtype_size(t->dtype);
    if (((uintptr_t)t->data % es) != 0) { /* unaligned in the file: private aligned copy */
        out->owned = aligned_alloc(64, (t->nbytes + 63) / 64 * 64);
        if (!out->owned) return dfl_seterr("%s: out of memory copying '%s'", c->where, name);
        memcpy(out->owned, t->data, t->nbytes);
        out->data = out->owned;
    } else {
        out->data = t->data;
    }
    return DFL_OK;
}

float *ld_vec(ld_ctx *c, const char *name, int nd, const int64_t *shape, float add) {
    const st_tensor *t = ld_tensor(c, name, nd, shape);
    if (!t) return NULL;
    float *v = malloc((size_t)t->numel * sizeof(float) + 1);
    if (!v) {
        dfl_seterr("%s: out of memory reading '%s'", c->where, name);
        return NULL;
    }
    st_read_f32(t, 0, t->numel, v);
    for (int64_t i = 0; i < t->numel; i++) v[i] += add;
    return v;
}

float *ld_vec1(ld_ctx *c, const char *name, int n, float add) {
    const int64_t shape[1] = {n};
    return ld_vec(c, name, 1, shape, add);
}

void ld_mat_free(dfl_mat *m) {
    free(m->owned);
    m->owned = NULL;
}
