/* Weight placement (src/io/st_place.c): a model whose matrices are copied into the arena computes
 * the same bits as one reading them from the file mapping (prefill, verification, tree), every
 * copied matrix starts on a cache line, only bound tensors are copied (a vision-language
 * checkpoint's vision trunk is not), a head-only open copies the embedding and lm_head alone, and
 * drafters draft the same bits either way. auto's rule on given numbers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/drafter.h"
#include "dfl/model.h"
#include "dfl/safetensors.h"
#include "testutil.h"

#define T 12

static int in_arena(const st_checkpoint *st, const void *p) {
    return st->arena && (const uint8_t *)p >= st->arena && (const uint8_t *)p < st->arena + st->arena_size;
}

/* A bound matrix of a copied model: in the arena on a cache line (or a private aligned copy). */
static int placed_ok(const st_checkpoint *st, const dfl_mat *w) {
    if (!w->data) return 1; /* not in this layer type */
    return (uintptr_t)w->data % 64 == 0 && (in_arena(st, w->data) || w->owned == w->data);
}

static void check_layers(const dfl_model *m, const char *name) {
    int bad = 0;
    bad += !placed_ok(&m->st, &m->embed) + !placed_ok(&m->st, &m->lm_head);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const dfl_layer_w *l = &m->layers[i];
        const dfl_mat *ws[] = {&l->q_proj, &l->k_proj,   &l->v_proj, &l->o_proj, &l->in_qkv, &l->in_z,  &l->in_b,
                               &l->in_a,   &l->out_proj, &l->gate,   &l->up,     &l->down,   &l->router};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) bad += !placed_ok(&m->st, ws[k]);
        for (int e = 0; l->moe && e < m->cfg.n_experts; e++)
            bad += !placed_ok(&m->st, &l->exp_gate[e]) + !placed_ok(&m->st, &l->exp_down[e]);
    }
    CHECK(bad == 0, "%s: %d copied matrices off the arena or a cache line", name, bad);
}

/* Logits of a prefill of T-4 tokens, a 4-token verification and a 5-node tree. */
static float *run(dfl_model *m, const char *name) {
    const int V = m->cfg.vocab;
    float *lg = malloc((size_t)(T + 5) * V * sizeof(float));
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7919 + 13) % 900);
    const int parent[5] = {-1, 0, 0, 1, 2};
    dfl_target_state s;
    int ok = target_state_init(&s, m, T + 16, T, 1) == DFL_OK && target_state_enable_tree(&s, 8) == DFL_OK;
    ok = ok && model_forward(&s, tok, T - 4, lg, 0, NULL) == DFL_OK;
    ok = ok && model_forward(&s, tok + T - 4, 4, lg + (size_t)(T - 4) * V, 0, NULL) == DFL_OK;
    ok = ok && target_state_rollback(&s, T - 4) == DFL_OK;
    ok = ok && model_forward_tree(&s, tok, parent, 5, lg + (size_t)T * V, NULL) == DFL_OK;
    CHECK(ok, "%s: forward: %s", name, dfl_errmsg());
    target_state_free(&s);
    return lg;
}

static int open_as(dfl_model *m, const char *name, st_place p, int flags) {
    st_place_set(p);
    const int rc = model_open(m, test_fixture(name), flags);
    CHECK(rc == DFL_OK, "%s (%s): %s", name, st_place_name(p), dfl_errmsg());
    return rc == DFL_OK;
}

static void check_target(const char *name) {
    dfl_model a, b;
    if (!open_as(&a, name, ST_PLACE_MAP, 0)) return;
    if (!open_as(&b, name, ST_PLACE_COPY, 0)) {
        model_close(&a);
        return;
    }
    CHECK(a.st.placed_bytes == 0 && !a.st.arena, "%s: mapped, yet %llu bytes copied", name,
          (unsigned long long)a.st.placed_bytes);
    uint64_t used = 0; /* the bytes of the tensors bound as matrices or vectors */
    for (int i = 0; i < b.st.n_tensors; i++) used += b.used[i] ? b.st.tensors[i].nbytes : 0;
    CHECK(b.st.placed_bytes > 0 && b.st.placed_bytes <= used, "%s: %llu bytes copied, %llu bound", name,
          (unsigned long long)b.st.placed_bytes, (unsigned long long)used);
    check_layers(&b, name);
    float *la = run(&a, name), *lb = run(&b, name);
    CHECK(memcmp(la, lb, (size_t)(T + 5) * a.cfg.vocab * sizeof(float)) == 0, "%s: copied weights change the logits",
          name);
    free(la), free(lb);
    model_close(&a), model_close(&b);
}

/* A head-only open copies the embedding (and an untied lm_head), nothing of the layers. */
static void check_head_only(const char *name) {
    dfl_model m;
    if (!open_as(&m, name, ST_PLACE_COPY, DFL_OPEN_HEAD_ONLY)) return;
    CHECK(in_arena(&m.st, m.embed.data) && in_arena(&m.st, m.lm_head.data), "%s: head-only: the head is not copied",
          name);
    int layer_copies = 0;
    for (int i = 0; i < m.cfg.n_layers; i++)
        layer_copies += in_arena(&m.st, m.layers[i].gate.data) + in_arena(&m.st, m.layers[i].q_proj.data) +
                        in_arena(&m.st, m.layers[i].in_qkv.data) + in_arena(&m.st, m.layers[i].router.data);
    CHECK(layer_copies == 0, "%s: head-only: %d layer matrices copied", name, layer_copies);
    const uint64_t head = m.embed.rows * (uint64_t)m.embed.cols * st_dtype_size(m.embed.dtype);
    CHECK(m.st.placed_bytes == head * (m.cfg.tie_embeddings ? 1 : 2), "%s: head-only copied %llu bytes, head %llu",
          name, (unsigned long long)m.st.placed_bytes, (unsigned long long)head);
    model_close(&m);
}

/* A DFlash drafter's block from copied weights equals the mapped one's. */
static void check_drafter(const char *target, const char *drafter) {
    dfl_model m;
    if (!open_as(&m, target, ST_PLACE_MAP, 0)) return;
    float *lg[2] = {NULL, NULL};
    int B = 0;
    for (int k = 0; k < 2; k++) {
        st_place_set(k ? ST_PLACE_COPY : ST_PLACE_MAP);
        dfl_drafter d;
        dfl_drafter_state s;
        if (drafter_open(&d, test_fixture(drafter), m.cfg.n_layers) != DFL_OK) {
            CHECK(0, "%s: %s", drafter, dfl_errmsg());
            break;
        }
        CHECK(k ? d.st.placed_bytes > 0 : d.st.placed_bytes == 0, "%s: placement %d not applied", drafter, k);
        B = d.cfg.block_size;
        const int H = m.cfg.hidden, nf = d.cfg.n_target_ids;
        float *feat = malloc((size_t)4 * nf * H * sizeof(float));
        for (int i = 0; i < 4 * nf * H; i++) feat[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        lg[k] = malloc((size_t)(B - 1) * m.cfg.vocab * sizeof(float));
        CHECK(drafter_state_init(&s, &d, &m, 32, B) == DFL_OK && drafter_add_context(&s, feat, 4) == DFL_OK &&
                  drafter_draft(&s, 15, B, lg[k]) == DFL_OK,
              "%s: draft: %s", drafter, dfl_errmsg());
        drafter_state_free(&s);
        drafter_close(&d);
        free(feat);
    }
    if (lg[0] && lg[1])
        CHECK(memcmp(lg[0], lg[1], (size_t)(B - 1) * m.cfg.vocab * sizeof(float)) == 0,
              "%s: copied weights change the draft", drafter);
    free(lg[0]), free(lg[1]);
    model_close(&m);
}

/* A safetensors file of two 64 KiB BF16 tensors whose data starts `pad` bytes past a cache line
 * (the header padded with spaces to put it there). */
static const char *write_padded(const char *dir, int pad) {
    static char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr,
                     "{\"a\":{\"dtype\":\"BF16\",\"shape\":[256,128],\"data_offsets\":[0,65536]},"
                     "\"b\":{\"dtype\":\"BF16\",\"shape\":[256,128],\"data_offsets\":[65536,131072]}}");
    while ((8 + n) % 64 != pad) hdr[n++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)n >> (8 * i));
    uint16_t *data = calloc(65536, sizeof(uint16_t));
    const int ok = data && fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n &&
                   fwrite(data, 2, 65536, f) == 65536;
    free(data);
    return fclose(f) == 0 && ok ? path : NULL;
}

/* auto maps a file whose matrices start on cache lines (a copy would gain nothing), and looks at
 * memory for one whose do not. */
static void check_auto_aligned(void) {
    st_place_set(ST_PLACE_AUTO);
    for (int pad = 0; pad <= 24; pad += 24) {
        const char *p = write_padded(test_tmpdir(), pad);
        st_checkpoint st = {0};
        if (!p || st_open_file(&st, p) != DFL_OK) {
            CHECK(0, "padded file %d: %s", pad, dfl_errmsg());
            continue;
        }
        const int copy = st_place_decide(&st, st_data_bytes(&st));
        const int said = strstr(st.place_why, "starts on a cache line") != NULL;
        CHECK(pad ? !said : (!copy && said), "data %d bytes into a line: %s", pad, st.place_why);
        st_close(&st);
    }
}

static void check_rule(void) {
    const uint64_t G = (uint64_t)1 << 30;
    CHECK(st_place_fits(10 * G, 100 * G, 1), "10 GiB in 100 GiB available: copy");
    CHECK(!st_place_fits(80 * G, 100 * G, 1), "80 GiB in 100 GiB available: map (a quarter kept)");
    CHECK(st_place_fits(75 * G, 100 * G, 1), "75 GiB in 100 GiB available: copy");
    CHECK(!st_place_fits(G, 4 * G + G / 2, 1), "1 GiB in 4.5 GiB available: map (4 GiB kept)");
    CHECK(!st_place_fits(G, 100 * G, 2), "two ranks on the machine: map");
    CHECK(!st_place_fits(1, 0, 1), "memory unknown: map");
    st_place p;
    CHECK(st_place_parse("copy", &p) == DFL_OK && p == ST_PLACE_COPY && st_place_parse("map", &p) == DFL_OK &&
              p == ST_PLACE_MAP && st_place_parse("auto", &p) == DFL_OK && p == ST_PLACE_AUTO,
          "placement names");
    CHECK(st_place_parse("mmap", &p) != DFL_OK && strstr(dfl_errmsg(), "'mmap'") && strstr(dfl_errmsg(), "auto, map"),
          "a bad placement is named: %s", dfl_errmsg());
}

int main(void) {
    check_rule();
    check_auto_aligned();
    /* dense, hybrid, BF16, FP8, sharded, MoE per expert and fused, a vision-language checkpoint */
    static const char *const targets[] = {"qwen3_tiny",     "qwen3_bf16",       "qwen3_fp8",
                                          "qwen35_text",    "qwen35_bf16",      "qwen35_sharded",
                                          "qwen3_moe_bf16", "qwen35_moe_fused", "qwen35_vlm"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) check_target(targets[i]);
    check_head_only("qwen3_tiny");
    check_head_only("qwen35_vlm");
    check_drafter("qwen3_tiny", "dflash_qwen3");
    check_drafter("qwen35_text", "dflash_qwen35");
    /* the vision trunk of a VLM checkpoint is never bound, so never copied */
    dfl_model v;
    if (open_as(&v, "qwen35_vlm", ST_PLACE_COPY, 0)) {
        uint64_t vision = 0;
        for (int i = 0; i < v.st.n_tensors; i++)
            if (model_component(&v, v.st.tensors[i].name) == DFL_COMP_VISION) vision += v.st.tensors[i].nbytes;
        CHECK(vision > 0 && v.st.placed_bytes + vision <= st_data_bytes(&v.st), "vlm: %llu vision bytes, %llu copied",
              (unsigned long long)vision, (unsigned long long)v.st.placed_bytes);
        model_close(&v);
    }
    st_place_set(ST_PLACE_AUTO);
    return test_done("test_place");
}
