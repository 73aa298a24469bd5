/* Fuzz sharded checkpoints: model.safetensors.index.json (st_open_dir) over a directory holding
 * two small shards, a.safetensors (tensors "x", "y") and b.safetensors ("z"). Any index loads or
 * is refused with a message; one that loads is a JSON object whose weight_map names, for each of
 * its tensors, the shard that holds it, and the model holds exactly the shards it names. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dfl/common.h"
#include "dfl/safetensors.h"
#include "fuzz_util.h"

static char dir[64], index_path[128];

static void cleanup(void) {
    static const char *const names[] = {"a.safetensors", "b.safetensors", "model.safetensors.index.json"};
    char p[160];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(dir, sizeof dir, "/tmp/dfl-fuzz-index-XXXXXX");
    FUZZ_CHECK(mkdtemp(dir), "mkdtemp");
    atexit(cleanup);
    static const float xy[4] = {1, 2, 3, 4};
    static const uint16_t z[2] = {0x3f80, 0x4000};
    st_write_entry a[2] = {{.name = "x", .dtype = ST_F32, .ndim = 1, .shape = {2}, .data = xy},
                           {.name = "y", .dtype = ST_F32, .ndim = 2, .shape = {1, 2}, .data = xy + 2}};
    st_write_entry b[1] = {{.name = "z", .dtype = ST_BF16, .ndim = 1, .shape = {2}, .data = z}};
    char p[160];
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    FUZZ_CHECK(st_write(p, a, 2) == DFL_OK, "%s", dfl_errmsg());
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    FUZZ_CHECK(st_write(p, b, 1) == DFL_OK, "%s", dfl_errmsg());
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    return 0;
}

static const char *shard_of(const st_checkpoint *m, const st_tensor *t) {
    const char *path = m->files[t->file_index].path, *base = strrchr(path, '/');
    return base ? base + 1 : path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(index_path, "wb");
    FUZZ_CHECK(f && fwrite(data, 1, size, f) == size && fclose(f) == 0, "cannot write the index");
    st_checkpoint m;
    dfl_clearerr();
    if (st_open_dir(&m, dir) != DFL_OK) {
        FUZZ_CHECK(dfl_errmsg()[0] != 0, "error without a message");
        FUZZ_CHECK(m.n_files == 0 && m.n_tensors == 0 && !m.files && !m.tensors, "a refused index left state");
        return 0;
    }
    char *text = fuzz_cstr(data, size);
    cJSON *root = cJSON_Parse(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    FUZZ_CHECK(cJSON_IsObject(root) && cJSON_IsObject(wm), "loaded without a weight_map object");
    int used[2] = {0, 0};
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        FUZZ_CHECK(cJSON_IsString(e), "weight_map['%s'] is not a string", e->string);
        const st_tensor *t = st_find(&m, e->string);
        FUZZ_CHECK(t && strcmp(shard_of(&m, t), e->valuestring) == 0, "tensor '%s' not in shard '%s'", e->string,
                   e->valuestring);
        used[strcmp(e->valuestring, "b.safetensors") == 0] = 1;
    }
    FUZZ_CHECK(m.n_files == used[0] + used[1], "%d shards open, the map names %d", m.n_files, used[0] + used[1]);
    for (int i = 0; i < m.n_tensors; i++) {
        float v[2];
        FUZZ_CHECK(st_read_f32(&m.tensors[i], 0, m.tensors[i].numel, v) == DFL_OK, "read %s", m.tensors[i].name);
    }
    cJSON_Delete(root);
    free(text);
    st_close(&m);
    return 0;
}
