/* safetensors reader: round trip, sharded index, and every malformed case the reference
 * reader rejects (each must give a message naming the problem, never a crash). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dfl/common.h"
#include "dfl/safetensors.h"
#include "testutil.h"

/* Write a raw safetensors file: 8-byte length, header text, data bytes. */
static const char *write_raw(const char *name, const char *header, uint64_t hlen_override, const void *data,
                             size_t nd) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    uint64_t n = hlen_override ? hlen_override : strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xff), f);
    fwrite(header, 1, strlen(header), f);
    if (nd) fwrite(data, 1, nd, f);
    fclose(f);
    return path;
}

static void expect_error(const char *name, const char *header, uint64_t hlen, size_t nd, const char *needle) {
    static unsigned char zeros[256];
    st_checkpoint m = {0};
    const char *p = write_raw(name, header, hlen, zeros, nd);
    int rc = st_open_file(&m, p);
    CHECK(rc == DFL_ERR, "%s: expected an error", name);
    CHECK(strstr(dfl_errmsg(), needle) != NULL, "%s: message '%s' lacks '%s'", name, dfl_errmsg(), needle);
    if (rc == DFL_OK) st_close(&m);
}

int main(void) {
    /* round trip through the writer, all three float dtypes */
    float f32[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    uint16_t bf16[6], f16[2] = {0x3c00, 0xc000}; /* 1.0, -2.0 */
    for (int i = 0; i < 6; i++) bf16[i] = st_f32_to_bf16(f32[i]);
    char path[512];
    snprintf(path, sizeof path, "%s/ok.safetensors", test_tmpdir());
    st_write_entry e[3] = {
        {.name = "a", .dtype = ST_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "b", .dtype = ST_BF16, .ndim = 1, .shape = {6}, .data = bf16},
        {.name = "c", .dtype = ST_F16, .ndim = 1, .shape = {2}, .data = f16},
    };
    CHECK(st_write(path, e, 3) == DFL_OK, "write: %s", dfl_errmsg());
    st_checkpoint m = {0};
    CHECK(st_open_file(&m, path) == DFL_OK, "open: %s", dfl_errmsg());
    CHECK(m.n_tensors == 3, "tensors %d", m.n_tensors);
    float out[6];
    const st_tensor *t = st_find(&m, "a");
    CHECK(t && t->shape[0] == 2 && t->shape[1] == 3 && t->dtype == ST_F32, "a shape");
    CHECK(t && st_read_f32(t, 0, 6, out) == DFL_OK && memcmp(out, f32, sizeof f32) == 0, "a values");
    t = st_find(&m, "b");
    CHECK(t && st_read_f32(t, 0, 6, out) == DFL_OK && out[2] == 3.5f && out[5] == -7.0f, "b values");
    t = st_find(&m, "c");
    CHECK(t && st_read_f32(t, 0, 2, out) == DFL_OK && out[0] == 1.0f && out[1] == -2.0f, "c values");
    CHECK(t && st_read_f32(t, 1, 2, out) == DFL_ERR, "read past the end must fail");
    CHECK(st_find(&m, "zz") == NULL, "missing name");
    st_close(&m);

    /* unaligned data: a 1-byte tensor first pushes the F32 tensor to an odd offset */
    {
        unsigned char data[1 + 8];
        float v[2] = {1.25f, -3.0f};
        data[0] = 7;
        memcpy(data + 1, v, 8);
        const char *hdr = "{\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                          "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
        const char *p = write_raw("unaligned.safetensors", hdr, 0, data, sizeof data);
        st_checkpoint u = {0};
        CHECK(st_open_file(&u, p) == DFL_OK, "unaligned open: %s", dfl_errmsg());
        const st_tensor *x = st_find(&u, "x");
        CHECK(x && st_read_f32(x, 0, 2, out) == DFL_OK && out[0] == 1.25f && out[1] == -3.0f, "unaligned values");
        const st_tensor *ut = st_find(&u, "u");
        CHECK(ut && st_read_f32(ut, 0, 1, out) == DFL_ERR && strstr(dfl_errmsg(), "U8"), "U8 refused by name: %s",
              dfl_errmsg());
        st_close(&u);
    }
    /* empty tensors lie anywhere; sorted by (begin, end) they tile the buffer (the reference
     * reader's order; sorting by begin alone could put [4, 8] before [4, 4] and refuse the file) */
    {
        const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                          "\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                          "\"e2\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[4,4]},"
                          "\"e3\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[4,4]},"
                          "\"e4\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]},"
                          "\"e5\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}";
        st_checkpoint u = {0};
        CHECK(st_open_file(&u, write_raw("empty.safetensors", hdr, 0, f32, 8)) == DFL_OK && u.n_tensors == 7,
              "empty tensors between others: %s", dfl_errmsg());
        st_close(&u);
    }
    /* metadata and header padding are accepted */
    {
        const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"F32\",\"shape\":[1],"
                          "\"data_offsets\":[0,4]}}    ";
        st_checkpoint u = {0};
        CHECK(st_open_file(&u, write_raw("meta.safetensors", hdr, 0, f32, 4)) == DFL_OK, "metadata: %s", dfl_errmsg());
        st_close(&u);
    }

    /* malformed files */
    expect_error("empty-header.safetensors", "", 0, 0, "not valid JSON");
    {
        char p[512];
        snprintf(p, sizeof p, "%s/tiny.safetensors", test_tmpdir());
        FILE *f = fopen(p, "wb");
        fwrite("abc", 1, 3, f);
        fclose(f);
        st_checkpoint u = {0};
        CHECK(st_open_file(&u, p) == DFL_ERR && strstr(dfl_errmsg(), "too short"), "3-byte file: %s", dfl_errmsg());
    }
    expect_error("hdrbig.safetensors", "{}", 1000, 0, "beyond the end of the file");
    expect_error("hdrlimit.safetensors", "{}", 200000000ull, 0, "exceeds the limit");
    expect_error("badjson.safetensors", "{\"x\": [", 0, 0, "not valid JSON");
    expect_error("notobj.safetensors", "[1,2]", 0, 0, "not a JSON object");
    expect_error("utf8.safetensors", "{\"\xff\xfe\":1}", 0, 0, "not valid UTF-8");
    expect_error("dtype.safetensors", "{\"x\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1,
                 "unknown dtype 'Q4'");
    expect_error("size.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8,
                 "expected numel 3");
    expect_error("hole.safetensors",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                 0, 12, "hole before it");
    expect_error("overlap.safetensors",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 0, 8, "overlaps");
    expect_error("trailing.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 12,
                 "trailing bytes");
    expect_error("truncated.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 8,
                 "beyond the data buffer");
    expect_error("dup.safetensors",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 0, 8, "duplicate tensor name 'x'");
    expect_error("overflow.safetensors",
                 "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 0, 4,
                 "overflows");
    expect_error("negshape.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 0, 4,
                 "tensor 'x': shape[0]: expected an integer in [0, 9000000000000000], found -1");
    /* numbers beyond the integer range are refused before any cast (casting them was undefined
     * behaviour, and the later comparison could be folded away) */
    expect_error(
        "hugeshape.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1e30],\"data_offsets\":[0,4]}}", 0, 4,
        "hugeshape.safetensors: tensor 'x': shape[0]: expected an integer in [0, 9000000000000000], found 1e+30");
    expect_error("infshape.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,1e999],\"data_offsets\":[0,4]}}", 0, 4,
                 "shape[1]: expected an integer in [0, 9000000000000000], found inf");
    expect_error("fracshape.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[0.5],\"data_offsets\":[0,4]}}", 0, 4,
                 "found 0.5");
    expect_error("strshape.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 0, 4,
                 "found \"1\"");
    expect_error("hugeoff.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e30]}}", 0, 4,
                 "tensor 'x': invalid data_offsets [0, 1e+30]");
    expect_error("hugeoff2.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1e30,1e30]}}", 0, 4,
                 "invalid data_offsets [1e+30, 1e+30]");
    expect_error("negoff.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 0, 4,
                 "invalid data_offsets [-4, 0]");
    expect_error("backoff.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 0, 4,
                 "invalid data_offsets [4, 0]");
    expect_error("stroff.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",4]}}", 0, 4,
                 "invalid data_offsets [\"0\", 4]");
    /* the product of the shape and the byte count overflow without wrapping */
    expect_error("overflow2.safetensors",
                 "{\"x\":{\"dtype\":\"F64\",\"shape\":[3000000000,3000000000],\"data_offsets\":[0,8]}}", 0, 8,
                 "overflows");
    expect_error("overflow3.safetensors",
                 "{\"x\":{\"dtype\":\"U8\",\"shape\":[0,9e15,9e15,9e15],\"data_offsets\":[0,4]}}", 0, 4,
                 "data_offsets span 4 bytes, expected numel 0");
    expect_error("hugespan.safetensors", "{\"x\":{\"dtype\":\"U8\",\"shape\":[9e15],\"data_offsets\":[0,9e15]}}", 0, 4,
                 "data_offsets end 9000000000000000 beyond the data buffer (4 bytes)");
    /* the reference reader: nothing but JSON whitespace after the object */
    expect_error("tail.safetensors", "{} x", 0, 0, "not valid JSON");
    expect_error("nulpad.safetensors", "{}\t\n", 5, 1, "not valid JSON"); /* the 5th byte: a NUL */
    expect_error("offsets.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 0, 4,
                 "data_offsets");
    expect_error("meta.bad.safetensors", "{\"__metadata__\":{\"a\":1}}", 0, 0, "__metadata__");

    /* sharded checkpoint: index, missing shard, tensor not where the map says */
    {
        char dir[512], p[600];
        snprintf(dir, sizeof dir, "%s/sharded", test_tmpdir());
        mkdir(dir, 0755);
        st_write_entry a = {.name = "w.a", .dtype = ST_F32, .ndim = 1, .shape = {2}, .data = f32};
        st_write_entry b = {.name = "w.b", .dtype = ST_F32, .ndim = 1, .shape = {3}, .data = f32};
        snprintf(p, sizeof p, "%s/s1.safetensors", dir);
        st_write(p, &a, 1);
        snprintf(p, sizeof p, "%s/s2.safetensors", dir);
        st_write(p, &b, 1);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(p, "w");
        fputs("{\"metadata\":{\"total_size\":999},\"weight_map\":{\"w.a\":\"s1.safetensors\",\"w.b\":\"s2."
              "safetensors\"}}",
              f);
        fclose(f);
        st_checkpoint s = {0};
        CHECK(st_open_dir(&s, dir) == DFL_OK, "sharded: %s", dfl_errmsg());
        CHECK(s.n_files == 2 && s.n_tensors == 2 && st_find(&s, "w.b") && st_find(&s, "w.b")->file_index == 1,
              "sharded contents");
        st_close(&s);
        f = fopen(p, "w");
        fputs("{\"weight_map\":{\"w.a\":\"s1.safetensors\",\"w.c\":\"s3.safetensors\"}}", f);
        fclose(f);
        CHECK(st_open_dir(&s, dir) == DFL_ERR && strstr(dfl_errmsg(), "shard 's3.safetensors'") &&
                  strstr(dfl_errmsg(), "missing"),
              "missing shard: %s", dfl_errmsg());
        f = fopen(p, "w");
        fputs("{\"weight_map\":{\"w.a\":\"s2.safetensors\",\"w.b\":\"s2.safetensors\"}}", f);
        fclose(f);
        CHECK(st_open_dir(&s, dir) == DFL_ERR && strstr(dfl_errmsg(), "'w.a'"), "misplaced tensor: %s", dfl_errmsg());
        f = fopen(p, "w");
        fputs("{\"weight_map\": 3}", f);
        fclose(f);
        CHECK(st_open_dir(&s, dir) == DFL_ERR && strstr(dfl_errmsg(), "weight_map"), "bad index: %s", dfl_errmsg());
        CHECK(st_open_dir(&s, "/nonexistent-dir") == DFL_ERR, "no files");
    }
    /* half-precision conversions */
    CHECK(st_f16_to_f32(0x0001) > 5.9e-8f && st_f16_to_f32(0x0001) < 6.0e-8f, "f16 subnormal");
    CHECK(st_f16_to_f32(0x7c00) > 1e38f, "f16 inf");
    CHECK(st_bf16_to_f32(st_f32_to_bf16(1.00390625f)) == 1.0f, "bf16 ties to even");
    return test_done("test_safetensors");
}
