/* Fuzz the safetensors reader (st_open_file): any file either loads or is refused with a message;
 * a file that loads has sorted unique names, tensors that tile the data buffer inside the map,
 * numel x dtype size = nbytes, working lookups and reads, and writes back (st_write) to a file
 * that loads with the same tensors and bytes. */
#include <string.h>

#include "dfl/common.h"
#include "dfl/safetensors.h"
#include "fuzz_util.h"

static void check_model(const st_checkpoint *m, const uint8_t *map, size_t size) {
    FUZZ_CHECK(m->n_files == 1, "%d files", m->n_files);
    const st_file *f = &m->files[0];
    FUZZ_CHECK(f->map_size == size && f->data_start >= 8 && f->data_start <= size, "map %zu data_start %zu",
               f->map_size, f->data_start);
    (void)map;
    size_t covered = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const st_tensor *t = &m->tensors[i];
        if (i) FUZZ_CHECK(strcmp(m->tensors[i - 1].name, t->name) < 0, "names not sorted/unique");
        FUZZ_CHECK(st_find(m, t->name) == t, "st_find(%s)", t->name);
        FUZZ_CHECK(t->dtype < ST_DTYPE_COUNT && t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "dtype/ndim");
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "negative dim");
            numel *= t->shape[d];
        }
        FUZZ_CHECK(numel == t->numel, "numel %lld vs shape %lld", (long long)t->numel, (long long)numel);
        FUZZ_CHECK((uint64_t)t->numel * st_dtype_size(t->dtype) == t->nbytes, "nbytes");
        FUZZ_CHECK(t->data >= f->map + f->data_start && t->data + t->nbytes <= f->map + f->map_size,
                   "tensor %s outside the map", t->name);
        covered += t->nbytes;
        /* read the first and last few elements of float tensors */
        if (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16) {
            float buf[4];
            int64_t n = t->numel < 4 ? t->numel : 4;
            FUZZ_CHECK(st_read_f32(t, 0, n, buf) == DFL_OK, "st_read_f32: %s", dfl_errmsg());
            FUZZ_CHECK(st_read_f32(t, t->numel - n, n, buf) == DFL_OK, "st_read_f32 tail: %s", dfl_errmsg());
            FUZZ_CHECK(st_read_f32(t, t->numel, 1, buf) != DFL_OK, "read past the end accepted");
        }
    }
    FUZZ_CHECK(covered == size - f->data_start, "tensors cover %zu of %zu data bytes", covered, size - f->data_start);
    FUZZ_CHECK(st_find(m, "") == NULL || st_find(m, "")->name[0] == 0, "st_find(\"\")");
    char meta[64];
    if (st_meta_get(m, 0, "format", meta, sizeof meta) == DFL_OK) FUZZ_CHECK(strlen(meta) < sizeof meta, "meta");
}

/* Write the tensors back and reload: same names, dtypes, shapes and bytes. Names with NUL
 * escapes would be cut by the C API, and the writer does not take __metadata__: skip those. */
static void check_rewrite(const st_checkpoint *m) {
    if (m->n_tensors > 256) return;
    st_write_entry *e = calloc((size_t)m->n_tensors + 1, sizeof *e);
    FUZZ_CHECK(e, "oom");
    for (int i = 0; i < m->n_tensors; i++) {
        const st_tensor *t = &m->tensors[i];
        e[i].name = t->name;
        e[i].dtype = t->dtype;
        e[i].ndim = t->ndim;
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
        e[i].data = t->data;
    }
    const char *path = fuzz_file(1, NULL, 0);
    FUZZ_CHECK(st_write(path, e, m->n_tensors) == DFL_OK, "st_write: %s", dfl_errmsg());
    st_checkpoint m2 = {0};
    FUZZ_CHECK(st_open_file(&m2, path) == DFL_OK, "rewritten file does not load: %s", dfl_errmsg());
    FUZZ_CHECK(m2.n_tensors == m->n_tensors, "%d tensors after rewrite, %d before", m2.n_tensors, m->n_tensors);
    for (int i = 0; i < m->n_tensors; i++) {
        const st_tensor *a = &m->tensors[i], *b = &m2.tensors[i];
        FUZZ_CHECK(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim &&
                       memcmp(a->shape, b->shape, sizeof a->shape) == 0 && a->nbytes == b->nbytes &&
                       (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0),
                   "tensor %s differs after rewrite", a->name);
    }
    st_close(&m2);
    free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    st_checkpoint m = {0};
    dfl_clearerr();
    if (st_open_file(&m, path) != DFL_OK) {
        FUZZ_CHECK(dfl_errmsg()[0] != 0, "error without a message");
        FUZZ_CHECK(m.n_files == 0 && m.n_tensors == 0, "a refused file left state behind");
        st_close(&m);
        return 0;
    }
    check_model(&m, data, size);
    check_rewrite(&m);
    st_close(&m);
    return 0;
}
