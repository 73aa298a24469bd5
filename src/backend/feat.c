/* Captured feature rows behind a handle (dfl_feat, dfl/backend.h): host rows are handled here, a
 * device's through its backend's feat_* functions. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"
#include "dfl/common.h"

int dfl_feat_alloc(dfl_feat *f, dfl_device d, int rows, int width) {
    memset(f, 0, sizeof *f);
    if (rows < 1 || width < 1) return dfl_seterr("feature rows: %d x %d floats (both must be >= 1)", rows, width);
    const dfl_backend *be = dfl_backend_of(d);
    if (!be) return dfl_seterr("feature rows on %s: not built into this dfl", dfl_device_name(d));
    *f = (dfl_feat){.device = d, .rows = rows, .width = width, .owned = 1};
    if (be->feat_alloc) return be->feat_alloc(f);
    f->host = calloc((size_t)rows * width, sizeof(float));
    if (!f->host) return dfl_seterr("out of memory for %d x %d feature rows", rows, width);
    return DFL_OK;
}

dfl_feat dfl_feat_view(float *host, int rows, int width) {
    return (dfl_feat){.device = DFL_DEVICE_CPU, .rows = rows, .width = width, .host = host};
}

void dfl_feat_free(dfl_feat *f) {
    if (f->owned) {
        const dfl_backend *be = dfl_backend_of(f->device);
        if (f->dev && be && be->feat_free) be->feat_free(f);
        free(f->host);
    }
    memset(f, 0, sizeof *f);
}

int dfl_feat_gather(dfl_feat *f, const int *idx, int n) {
    if (n < 0 || n > f->rows) return dfl_seterr("feature gather of %d rows: the handle holds %d", n, f->rows);
    for (int k = 0; k < n; k++)
        if (idx[k] < k || idx[k] >= f->rows || (k > 0 && idx[k] <= idx[k - 1]))
            return dfl_seterr("feature gather: row %d at %d (rows must ascend, each at or after its place, below %d)",
                              idx[k], k, f->rows);
    if (!f->host) return dfl_backend_of(f->device)->feat_gather(f, idx, n);
    const size_t w = (size_t)f->width;
    for (int k = 0; k < n; k++) /* idx[k] >= k ascending: a source is never an earlier destination */
        if (idx[k] != k) memcpy(f->host + k * w, f->host + idx[k] * w, w * sizeof(float));
    return DFL_OK;
}

int dfl_feat_read(const dfl_feat *f, int row0, int n, float *dst) {
    if (row0 < 0 || n < 0 || row0 + n > f->rows)
        return dfl_seterr("feature read of rows %d..%d: the handle holds %d", row0, row0 + n - 1, f->rows);
    if (!f->host) return dfl_backend_of(f->device)->feat_read(f, row0, n, dst);
    memcpy(dst, f->host + (size_t)row0 * f->width, (size_t)n * f->width * sizeof(float));
    return DFL_OK;
}

const float *dfl_feat_host_rows(const dfl_feat *f, int row0, int n, float *stage) {
    if (f->host && row0 >= 0 && n >= 0 && row0 + n <= f->rows) return f->host + (size_t)row0 * f->width;
    return dfl_feat_read(f, row0, n, stage) == DFL_OK ? stage : NULL;
}
