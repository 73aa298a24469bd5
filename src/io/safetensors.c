/* safetensors: mmap reader with the reference reader's validation, shard index, writer. */
#include "dfl/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dfl/common.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2},   [ST_BF16] = {"BF16", 2},       [ST_F64] = {"F64", 8},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4},   [ST_I16] = {"I16", 2},         [ST_I8] = {"I8", 1},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_U16] = {"U16", 2}, [ST_U32] = {"U32", 4},   [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(st_dtype dt) { return dt < ST_DTYPE_COUNT ? dtype_info[dt].name : "?"; }
size_t st_dtype_size(st_dtype dt) { return dt < ST_DTYPE_COUNT ? dtype_info[dt].size : 0; }

static int dtype_from_name(const char *s, st_dtype *out) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(s, dtype_info[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    return -1;
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union {
        uint32_t u;
        float f;
    } v = {.u = u};
    return v.f;
}

uint16_t st_f32_to_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
    uint32_t rounding = 0x7fff + ((v.u >> 16) & 1);                               /* round to nearest even, as torch */
    return (uint16_t)((v.u + rounding) >> 16);
}

/* Strict UTF-8 validation (no overlongs, no surrogates, <= U+10FFFF). */
static int utf8_valid(const uint8_t *s, size_t n, size_t *bad_at) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xe0) == 0xc0) {
            len = 2;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4;
            cp = c & 0x07;
        } else goto bad;
        if (i + len > n) goto bad;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) goto bad;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            goto bad;
        i += len;
    }
    return 1;
bad:
    *bad_at = i;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

/* By (begin, end) as the reference reader sorts: an empty tensor goes before the one that
 * starts where it lies. */
static int cmp_tensor_ptr_offset(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The largest shape entry or offset accepted: every integer below it is exact in a double. */
#define ST_MAX_INT 9.0e15

/* v as an integer in [0, ST_MAX_INT]: checked on the double before the cast, which would be
 * undefined out of range. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= ST_MAX_INT) ||
        v->valuedouble != floor(v->valuedouble))
        return -1;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* Parse one tensor entry of the header into t (data offsets relative to buf). */
static int parse_entry(const char *path, const cJSON *item, const uint8_t *buf, size_t buf_size, st_tensor *t,
                       size_t *begin, size_t *end) {
    const char *name = item->string;
    if (!cJSON_IsObject(item)) return dfl_seterr("%s: tensor '%s': expected an object in the header", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt)) return dfl_seterr("%s: tensor '%s': missing string field 'dtype'", path, name);
    if (!cJSON_IsArray(sh)) return dfl_seterr("%s: tensor '%s': missing array field 'shape'", path, name);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return dfl_seterr("%s: tensor '%s': 'data_offsets' must be an array of 2 integers", path, name);
    if (dtype_from_name(dt->valuestring, &t->dtype) != 0)
        return dfl_seterr("%s: tensor '%s': unknown dtype '%s'", path, name, dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return dfl_seterr("%s: tensor '%s': %d dimensions, at most %d supported", path, name, nd, ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int overflow = 0;
    char f1[48], f2[48];
    for (int i = 0; i < nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(sh, i);
        uint64_t dim;
        if (json_uint(d, &dim))
            return dfl_seterr("%s: tensor '%s': shape[%d]: expected an integer in [0, %.0f], found %s", path, name, i,
                              ST_MAX_INT, dfl_json_brief(d, f1, sizeof f1));
        t->shape[i] = (int64_t)dim;
        if (dim && numel > UINT64_MAX / dim) overflow = 1;
        else numel *= dim;
    }
    size_t es = st_dtype_size(t->dtype);
    if (overflow || numel > (uint64_t)INT64_MAX / es)
        return dfl_seterr("%s: tensor '%s': shape overflows (numel x dtype size > 2^63)", path, name);
    const cJSON *ob = cJSON_GetArrayItem(off, 0), *oe = cJSON_GetArrayItem(off, 1);
    uint64_t b, e;
    if (json_uint(ob, &b) || json_uint(oe, &e) || e < b)
        return dfl_seterr("%s: tensor '%s': invalid data_offsets [%s, %s] (expected integers begin <= end)", path, name,
                          dfl_json_brief(ob, f1, sizeof f1), dfl_json_brief(oe, f2, sizeof f2));
    if (e - b != numel * es)
        return dfl_seterr("%s: tensor '%s': data_offsets span %llu bytes, expected numel %llu x %zu (%s) = %llu", path,
                          name, (unsigned long long)(e - b), (unsigned long long)numel, es, st_dtype_name(t->dtype),
                          (unsigned long long)(numel * es));
    if (e > buf_size)
        return dfl_seterr("%s: tensor '%s': data_offsets end %llu beyond the data buffer (%zu bytes): the file is "
                          "truncated (an incomplete download or copy?) or its header is corrupt",
                          path, name, (unsigned long long)e, buf_size);
    *begin = (size_t)b;
    *end = (size_t)e;
    t->numel = (int64_t)numel;
    t->nbytes = *end - *begin;
    t->data = buf + *begin;
    return DFL_OK;
}

int st_open_file(st_checkpoint *m, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return dfl_seterr("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return dfl_seterr("%s: cannot stat: %s", path, strerror(errno));
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        close(fd);
        return dfl_seterr("%s: file is %zu bytes, too short for a safetensors header (8-byte length)", path, size);
    }
    uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return dfl_seterr("%s: mmap failed: %s", path, strerror(errno));

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | map[i];
    cJSON *root = NULL;
    st_tensor *ts = NULL;
    int nt = 0;
    const st_tensor **byoff = NULL;
    const char *hdr = (const char *)map + 8, *hdr_end = NULL;
    const uint8_t *buf = NULL;
    size_t buf_size = 0, expect = 0;
    int count = 0;
    st_file *nf = NULL;
    st_tensor *nts = NULL;
    if (n > ST_MAX_HEADER) {
        dfl_seterr("%s: header length %llu exceeds the limit of %llu bytes", path, (unsigned long long)n,
                   ST_MAX_HEADER);
        goto fail;
    }
    if (n > size - 8) {
        dfl_seterr("%s: header length %llu is beyond the end of the file (%zu bytes)", path, (unsigned long long)n,
                   size);
        goto fail;
    }
    size_t bad;
    if (!utf8_valid(map + 8, (size_t)n, &bad)) {
        dfl_seterr("%s: header is not valid UTF-8 (byte %zu of the header)", path, bad);
        goto fail;
    }
    /* as the reference reader: only JSON whitespace may follow the object (padding is spaces) */
    root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &hdr_end, 0);
    while (root && hdr_end < hdr + n && *hdr_end && strchr(" \t\r\n", *hdr_end)) hdr_end++;
    if (!root || hdr_end != hdr + n) {
        dfl_seterr("%s: header is not valid JSON", path);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        dfl_seterr("%s: header is not a JSON object", path);
        goto fail;
    }
    buf = map + 8 + n;
    buf_size = size - 8 - (size_t)n;
    count = cJSON_GetArraySize(root);
    ts = calloc((size_t)count + 1, sizeof *ts);
    if (!ts) {
        dfl_seterr("%s: out of memory", path);
        goto fail;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(item)) {
                dfl_seterr("%s: __metadata__ must be an object of strings", path);
                goto fail;
            }
            const cJSON *kv;
            cJSON_ArrayForEach(kv, item) if (!cJSON_IsString(kv)) {
                dfl_seterr("%s: __metadata__ value for '%s' is not a string", path, kv->string);
                goto fail;
            }
            continue;
        }
        size_t b, e;
        st_tensor *t = &ts[nt];
        if (parse_entry(path, item, buf, buf_size, t, &b, &e) != DFL_OK) goto fail;
        if (!(t->name = strdup(item->string))) {
            dfl_seterr("%s: out of memory", path);
            goto fail;
        }
        t->file_index = m->n_files;
        nt++;
    }
    /* Duplicate names. */
    qsort(ts, (size_t)nt, sizeof *ts, cmp_tensor_name);
    for (int i = 1; i < nt; i++)
        if (strcmp(ts[i - 1].name, ts[i].name) == 0) {
            dfl_seterr("%s: duplicate tensor name '%s' in the header", path, ts[i].name);
            goto fail;
        }
    /* Offsets must tile the buffer: contiguous from 0, no holes, no overlaps, no trailing bytes. */
    byoff = malloc(((size_t)nt + 1) * sizeof *byoff);
    if (!byoff) {
        dfl_seterr("%s: out of memory", path);
        goto fail;
    }
    for (int i = 0; i < nt; i++) byoff[i] = &ts[i];
    qsort(byoff, (size_t)nt, sizeof *byoff, cmp_tensor_ptr_offset);
    for (int i = 0; i < nt; i++) {
        size_t b = (size_t)(byoff[i]->data - buf);
        if (b != expect) {
            dfl_seterr("%s: tensor '%s' starts at byte %zu of the data buffer, expected %zu (%s)", path, byoff[i]->name,
                       b, expect, b > expect ? "hole before it" : "overlaps the previous tensor");
            goto fail;
        }
        expect = b + byoff[i]->nbytes;
    }
    if (expect != buf_size) {
        dfl_seterr("%s: %zu trailing bytes after the last tensor (data buffer %zu bytes, tensors cover %zu)", path,
                   buf_size - expect, buf_size, expect);
        goto fail;
    }
    free(byoff);
    cJSON_Delete(root);

    /* Append to the model. */
    nf = realloc(m->files, (size_t)(m->n_files + 1) * sizeof *nf);
    nts = realloc(m->tensors, (size_t)(m->n_tensors + nt + 1) * sizeof *nts);
    if (!nf || !nts) {
        if (nf) m->files = nf;
        if (nts) m->tensors = nts;
        dfl_seterr("%s: out of memory", path);
        byoff = NULL;
        root = NULL;
        goto fail;
    }
    m->files = nf;
    m->tensors = nts;
    m->files[m->n_files] = (st_file){.path = strdup(path), .map = map, .map_size = size, .data_start = 8 + n};
    m->n_files++;
    memcpy(m->tensors + m->n_tensors, ts, (size_t)nt * sizeof *ts);
    m->n_tensors += nt;
    free(ts);
    qsort(m->tensors, (size_t)m->n_tensors, sizeof *m->tensors, cmp_tensor_name);
    for (int i = 1; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i - 1].name, m->tensors[i].name) == 0)
            return dfl_seterr("tensor '%s' appears in two files: %s and %s", m->tensors[i].name,
                              m->files[m->tensors[i - 1].file_index].path, m->files[m->tensors[i].file_index].path);
    return DFL_OK;
fail:
    free(byoff);
    if (ts)
        for (int i = 0; i < nt; i++) free(ts[i].name);
    free(ts);
    cJSON_Delete(root);
    munmap(map, size);
    return DFL_ERR;
}

static int open_index(st_checkpoint *m, const char *dir, const char *index_path) {
    char *text = dfl_read_file(index_path, NULL);
    if (!text) return DFL_ERR;
    cJSON *root = cJSON_ParseWithOpts(text, NULL, 1);
    const long at = root || !cJSON_GetErrorPtr() ? -1L : (long)(cJSON_GetErrorPtr() - text);
    free(text);
    if (!root) return dfl_seterr("%s: not valid JSON (near byte %ld)", index_path, at);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dfl_seterr("%s: not a JSON object", index_path);
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return dfl_seterr("%s: missing object field 'weight_map'", index_path);
    }
    /* Open each distinct shard once, in order of first mention. */
    int rc = DFL_OK;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e)) {
            rc = dfl_seterr("%s: weight_map['%s'] is not a file name", index_path, e->string);
            break;
        }
        int seen = 0;
        for (int i = 0; i < m->n_files && !seen; i++) {
            const char *base = strrchr(m->files[i].path, '/');
            seen = strcmp(base ? base + 1 : m->files[i].path, e->valuestring) == 0;
        }
        if (seen) continue;
        if (strchr(e->valuestring, '/')) {
            rc = dfl_seterr("%s: shard name '%s' must be a plain file name", index_path, e->valuestring);
            break;
        }
        char *p = dfl_path_join(dir, e->valuestring);
        if (!dfl_is_file(p)) {
            rc = dfl_seterr("%s: shard '%s' named in weight_map (for tensor '%s') is missing", index_path,
                            e->valuestring, e->string);
            free(p);
            break;
        }
        rc = st_open_file(m, p);
        free(p);
        if (rc != DFL_OK) break;
    }
    /* Every tensor named in the map must be in the shard the map names. */
    if (rc == DFL_OK) cJSON_ArrayForEach(e, wm) {
            const st_tensor *t = st_find(m, e->string);
            if (!t) {
                rc = dfl_seterr("%s: tensor '%s' is listed in weight_map (shard %s) but not found in it", index_path,
                                e->string, e->valuestring);
                break;
            }
            const char *base = strrchr(m->files[t->file_index].path, '/');
            if (strcmp(base ? base + 1 : m->files[t->file_index].path, e->valuestring) != 0) {
                rc = dfl_seterr("%s: tensor '%s' is mapped to %s but stored in %s", index_path, e->string,
                                e->valuestring, base ? base + 1 : m->files[t->file_index].path);
                break;
            }
        }
    cJSON_Delete(root);
    return rc;
}

int st_open_dir(st_checkpoint *m, const char *dir) {
    memset(m, 0, sizeof *m);
    int rc;
    char *index = dfl_path_join(dir, "model.safetensors.index.json");
    char *single = dfl_path_join(dir, "model.safetensors");
    if (dfl_is_file(index)) {
        rc = open_index(m, dir, index);
    } else if (dfl_is_file(single)) {
        rc = st_open_file(m, single);
    } else {
        rc = dfl_seterr("%s: no model.safetensors.index.json or model.safetensors", dir);
    }
    free(index);
    free(single);
    if (rc != DFL_OK) st_close(m);
    return rc;
}

void st_close(st_checkpoint *m) {
    st_place_free(m);
    for (int i = 0; i < m->n_files; i++) {
        munmap(m->files[i].map, m->files[i].map_size);
        free(m->files[i].path);
    }
    for (int i = 0; i < m->n_tensors; i++) free(m->tensors[i].name);
    free(m->files);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

const st_tensor *st_find(const st_checkpoint *m, const char *name) {
    int lo = 0, hi = m->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(m->tensors[mid].name, name);
        if (c == 0) return &m->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

int st_read_f32(const st_tensor *t, int64_t first, int64_t n, float *out) {
    if (first < 0 || n < 0 || first + n > t->numel)
        return dfl_seterr("tensor '%s': read of [%lld, %lld) outside its %lld elements", t->name, (long long)first,
                          (long long)(first + n), (long long)t->numel);
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32: memcpy(out, p + first * 4, (size_t)n * 4); return DFL_OK;
    case ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + (first + i) * 2, 2);
            out[i] = st_bf16_to_f32(h);
        }
        return DFL_OK;
    case ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + (first + i) * 2, 2);
            out[i] = st_f16_to_f32(h);
        }
        return DFL_OK;
    case ST_F8_E4M3:
        for (int64_t i = 0; i < n; i++) out[i] = st_f8e4m3_to_f32(p[first + i]);
        return DFL_OK;
    default:
        return dfl_seterr("tensor '%s': dtype %s is not supported (F32, F16, BF16 and F8_E4M3 are)", t->name,
                          st_dtype_name(t->dtype));
    }
}

int st_write(const char *path, const st_write_entry *entries, int n) {
    return st_write_meta(path, entries, n, NULL, 0);
}

int st_write_meta(const char *path, const st_write_entry *entries, int n, const char *const (*meta)[2], int n_meta) {
    cJSON *root = cJSON_CreateObject();
    if (n_meta > 0) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; i < n_meta; i++) cJSON_AddStringToObject(md, meta[i][0], meta[i][1]);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_write_entry *e = &entries[i];
        cJSON *o = cJSON_AddObjectToObject(root, e->name);
        cJSON_AddStringToObject(o, "dtype", st_dtype_name(e->dtype));
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        size_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e->shape[d]));
            numel *= (size_t)e->shape[d];
        }
        size_t nb = numel * st_dtype_size(e->dtype);
        cJSON *offs = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb)));
        off += nb;
    }
    char *hdr = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return dfl_seterr("%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = hl; i < padded && ok; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    for (int i = 0; i < n && ok; i++) {
        size_t numel = 1;
        for (int d = 0; d < entries[i].ndim; d++) numel *= (size_t)entries[i].shape[d];
        size_t nb = numel * st_dtype_size(entries[i].dtype);
        ok = fwrite(entries[i].data, 1, nb, f) == nb;
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok) return dfl_seterr("%s: write error: %s", path, strerror(errno));
    return DFL_OK;
}

int st_meta_get(const st_checkpoint *m, int file, const char *key, char *buf, size_t n) {
    if (file < 0 || file >= m->n_files) return dfl_seterr("safetensors: no file %d", file);
    const st_file *f = &m->files[file];
    cJSON *root = cJSON_ParseWithLength((const char *)f->map + 8, f->data_start - 8);
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(md, key);
    int rc = DFL_OK;
    if (!cJSON_IsString(v)) rc = dfl_seterr("%s: __metadata__ has no '%s'", f->path, key);
    else snprintf(buf, n, "%s", v->valuestring);
    cJSON_Delete(root);
    return rc;
}
