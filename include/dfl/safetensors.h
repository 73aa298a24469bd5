/* safetensors reader: mmap'd files, validated as the reference reader validates them
 * (docs/design.md §1), and sharded checkpoints through model.safetensors.index.json. */
#ifndef DFL_SAFETENSORS_H
#define DFL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER 100000000ull /* the reference reader's bound on the JSON header */

typedef enum st_dtype {
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U8,
    ST_BOOL,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_U16,
    ST_U32,
    ST_U64,
    ST_DTYPE_COUNT
} st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data; /* into the mmap; may be unaligned for the element size */
    size_t nbytes;
    int file_index;        /* which shard (index into st_checkpoint.files) */
    const uint8_t *placed; /* its copy in the arena (st_place_tensor), or NULL */
} st_tensor;

typedef struct st_file {
    char *path;
    uint8_t *map; /* whole file, PROT_READ */
    size_t map_size;
    size_t data_start; /* 8 + header length */
} st_file;

/* A set of tensors from one file or from all shards of a checkpoint. */
typedef struct st_checkpoint {
    st_file *files;
    int n_files;
    st_tensor *tensors; /* sorted by name */
    int n_tensors;
    /* placed copies (st_place_tensor): an anonymous arena, huge-page aligned */
    uint8_t *arena;
    size_t arena_size, arena_used;
    uint64_t placed_bytes; /* tensor bytes copied into it */
    double place_s;        /* seconds the copies took */
    char place_why[160];   /* st_place_decide's choice and its reason, for logs */
} st_checkpoint;

const char *st_dtype_name(st_dtype dt);
size_t st_dtype_size(st_dtype dt);

/* Open one .safetensors file. Returns DFL_OK or DFL_ERR (message names the file). */
int st_open_file(st_checkpoint *m, const char *path);
/* Open a checkpoint directory: model.safetensors.index.json (shards) or model.safetensors,
 * or, failing both, the single *.safetensors file in the directory. */
int st_open_dir(st_checkpoint *m, const char *dir);
void st_close(st_checkpoint *m);

/* Weight placement (st_place.c): bound matrices read in place from the mapping (map) or copied
 * once into an arena at 64-byte aligned addresses on huge pages (copy: safetensors data sits
 * 8-byte aligned, and loads that straddle cache lines slow compute-bound products); auto copies
 * when some tensor starts inside a cache line, the tensors fit the memory available with a
 * quarter of it (at least 4 GiB) to spare and no other MPI rank shares the machine. The
 * process-wide mode starts as DFL_WEIGHTS, else auto. */
typedef enum st_place { ST_PLACE_AUTO, ST_PLACE_MAP, ST_PLACE_COPY } st_place;
int st_place_parse(const char *s, st_place *out);
const char *st_place_name(st_place p);
st_place st_place_get(void);
void st_place_set(st_place p);
/* auto's rule: bytes of tensors against MemAvailable and the ranks on this machine. */
int st_place_fits(uint64_t bytes, uint64_t mem_available, int local_ranks);
/* Whether m's bound matrices, about `bytes` of them, are to be copied (1) or mapped (0); the
 * choice and its reason go to m->place_why. */
int st_place_decide(st_checkpoint *m, uint64_t bytes);
/* Bytes of all of m's tensors. */
uint64_t st_data_bytes(const st_checkpoint *m);
/* A copy of t's bytes in m's arena (reserved on first use), 64-byte aligned; NULL + error. */
const uint8_t *st_place_tensor(st_checkpoint *m, const st_tensor *t);
void st_place_free(st_checkpoint *m);

/* Lookup by exact name; NULL if absent. */
const st_tensor *st_find(const st_checkpoint *m, const char *name);

/* Convert n elements starting at element `first` of t to float32 (F32/F16/BF16, and F8_E4M3's
 * raw codes without their block scales). */
int st_read_f32(const st_tensor *t, int64_t first, int64_t n, float *out);

/* Write tensors to a new safetensors file. Each entry: name, dtype, shape, data. */
typedef struct st_write_entry {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} st_write_entry;
int st_write(const char *path, const st_write_entry *entries, int n);
/* The same with a __metadata__ object of n_meta {key, value} string pairs. */
int st_write_meta(const char *path, const st_write_entry *entries, int n, const char *const (*meta)[2], int n_meta);
/* A __metadata__ string of file `file` of m into buf; DFL_ERR naming the file if absent. */
int st_meta_get(const st_checkpoint *m, int file, const char *key, char *buf, size_t n);

/* Half-precision conversions used by the reader and the kernels. */
static inline float st_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}
float st_f16_to_f32(uint16_t h);
uint16_t st_f32_to_bf16(float f);

/* float8_e4m3fn (sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities; S.1111.111 is
 * NaN; exponent 0 holds the subnormals m/8 * 2^-6): the magnitude bits shifted into a float32's
 * exponent and mantissa fields make 2^(e-127) (1 + m/8), or for e = 0 the float32 subnormal
 * m/8 * 2^-126, so one multiplication by 2^120 rebiases it exactly. */
static inline float st_f8e4m3_to_f32(uint8_t b) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)(b & 0x7f) << 20};
    const float a = (b & 0x7f) == 0x7f ? __builtin_nanf("") : v.f * 0x1p120f;
    return b & 0x80 ? -a : a;
}

#endif
