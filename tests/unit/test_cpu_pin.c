/* The CPU backend's outputs, pinned bit for bit: a hash of the logits and captured hidden states
 * of a prefill, a 3-token verification, a rollback + decode and a DDTree forward + commit on the
 * fixtures, on the portable C kernels (DFL_ISA=generic: the same bits on every x86-64; the fixtures
 * themselves are the same bytes everywhere since tools/make_fixtures.py runs MKL's compatible path), against
 * tests/data/cpu_pin.txt. Refactors of the forward (the backend seam, op extraction) must leave
 * them unchanged; DFL_PIN_WRITE=1 prints the lines to regenerate the file after an intended
 * change of the numbers (say why in the commit). The pins were written by the code before the
 * backend seam (commit 9df09eb). */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "dfl/model.h"
#include "testutil.h"

#define T 24

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t pin(const char *name) {
    dfl_model m;
    if (model_open(&m, test_fixture(name), 0) != DFL_OK) {
        CHECK(0, "%s: %s", name, dfl_errmsg());
        return 0;
    }
    const int V = m.cfg.vocab, H = m.cfg.hidden, L = m.cfg.n_layers;
    int layers[2] = {0, L - 1};
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7919 + 13) % 900);
    float *lg = malloc((size_t)T * V * sizeof(float)), *hs = malloc((size_t)T * 2 * H * sizeof(float));
    const dfl_capture cap = {.n_layers = 2, .layers = layers, .out = hs};
    uint64_t h = 0xcbf29ce484222325ull;
    dfl_target_state s;
    CHECK(target_state_init(&s, &m, T + 16, T, 1) == DFL_OK && target_state_enable_tree(&s, 8) == DFL_OK, "%s: state",
          name);
    CHECK(model_forward(&s, tok, T - 6, lg, 0, &cap) == DFL_OK, "%s: prefill", name);
    h = fnv(h, lg, (size_t)(T - 6) * V * sizeof(float)), h = fnv(h, hs, (size_t)(T - 6) * 2 * H * sizeof(float));
    CHECK(model_forward(&s, tok + T - 6, 3, lg, 0, &cap) == DFL_OK, "%s: verify", name);
    h = fnv(h, lg, (size_t)3 * V * sizeof(float)), h = fnv(h, hs, (size_t)3 * 2 * H * sizeof(float));
    CHECK(target_state_rollback(&s, T - 5) == DFL_OK, "%s: rollback", name);
    CHECK(model_forward(&s, tok + T - 3, 1, lg, 1, NULL) == DFL_OK, "%s: decode", name);
    h = fnv(h, lg, (size_t)V * sizeof(float));
    const int parent[6] = {-1, 0, 0, 1, 3, 2}, path[4] = {0, 1, 3, 4};
    CHECK(model_forward_tree(&s, tok, parent, 6, lg, NULL) == DFL_OK, "%s: tree", name);
    h = fnv(h, lg, (size_t)6 * V * sizeof(float));
    CHECK(target_state_tree_commit(&s, path, 4) == DFL_OK, "%s: commit", name);
    CHECK(model_forward(&s, tok + 5, 2, lg, 0, NULL) == DFL_OK, "%s: after commit", name);
    h = fnv(h, lg, (size_t)2 * V * sizeof(float));
    target_state_free(&s);
    model_close(&m);
    free(lg), free(hs);
    return h;
}

int main(void) {
    CHECK(kn_isa_set(KN_ISA_GENERIC) == DFL_OK, "generic kernels: %s", dfl_errmsg());
    const char *names[] = {"qwen3_tiny", "qwen3_bf16",      "qwen35_text", "qwen35_bf16", "qwen35_r1",
                           "qwen3_moe",  "qwen35_moe_text", "qwen3_fp8",   "qwen35_fp8"};
    const int write = getenv("DFL_PIN_WRITE") != NULL;
    const char *src = getenv("DFL_SOURCE");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/cpu_pin.txt", src ? src : ".");
    FILE *f = write ? NULL : fopen(path, "r");
    CHECK(write || f, "cannot read %s", path);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const uint64_t h = pin(names[i]);
        if (write) {
            printf("%s %016llx\n", names[i], (unsigned long long)h);
            continue;
        }
        char want_name[64] = "";
        unsigned long long want = 0;
        if (!f || fscanf(f, "%63s %llx", want_name, &want) != 2) {
            CHECK(0, "%s: no pin in %s", names[i], path);
            continue;
        }
        CHECK(strcmp(want_name, names[i]) == 0, "%s: the pin file lists %s here", names[i], want_name);
        CHECK(h == want, "%s: cpu outputs changed: hash %016llx, pinned %016llx", names[i], (unsigned long long)h,
              want);
    }
    if (f) fclose(f);
    return write ? 0 : test_done("test_cpu_pin");
}
