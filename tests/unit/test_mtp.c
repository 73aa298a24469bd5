/* The target's MTP head as a drafter (dfl/mtp.h), in the speculative loop: greedy output equals
 * autoregressive decoding for chain (several block sizes) and DDTree, with drafts accepted (the
 * fitted heads of qwen35_mtp and of the MoE qwen35_moe_mtp), the head's context equal to the
 * committed length after every run; a context fed in one call or position by position drafts the same logits; the
 * argument forms and the refusals. Runs under ASan+UBSan too. */
#include <string.h>

#include "dfl/common.h"
#include "dfl/mtp.h"
#include "dfl/spec.h"
#include "testutil.h"

#define N_GEN 32

static void argument_forms(void) {
    char dir[256];
    CHECK(mtp_parse_arg("mtp", "/t", dir, sizeof dir) == 1 && strcmp(dir, "/t") == 0, "'mtp' -> the target: %s", dir);
    CHECK(mtp_parse_arg("/a/b:mtp", "/t", dir, sizeof dir) == 1 && strcmp(dir, "/a/b") == 0, "'DIR:mtp' -> DIR: %s",
          dir);
    CHECK(mtp_parse_arg("/a/drafter", "/t", dir, sizeof dir) == 0, "a drafter directory is not the MTP head");
    CHECK(mtp_parse_arg(":mtp", "/t", dir, sizeof dir) == 0, "':mtp' names no directory");
}

static void refusals(void) {
    dfl_model m;
    dfl_mtp h;
    CHECK(model_open(&m, test_fixture("qwen35_text"), 0) == DFL_OK, "%s", dfl_errmsg());
    CHECK(mtp_open(&h, m.dir, &m, 0) == DFL_ERR && strstr(dfl_errmsg(), "no mtp.* tensors"),
          "a text-only export has no head: %s", dfl_errmsg());
    CHECK(mtp_open(&h, test_fixture("qwen35_bf16"), &m, 0) == DFL_ERR && strstr(dfl_errmsg(), "hidden_size 96 != "),
          "another model's head: %s", dfl_errmsg());
    model_close(&m);
    CHECK(model_open(&m, test_fixture("qwen3_tiny"), 0) == DFL_OK, "%s", dfl_errmsg());
    CHECK(mtp_open(&h, m.dir, &m, 0) == DFL_ERR && strstr(dfl_errmsg(), "has no MTP head"), "dense Qwen3: %s",
          dfl_errmsg());
    model_close(&m);
}

/* prompt: one of the prompts the fixture's head was fitted on */
static void lossless(const char *fixture, const int32_t *prompt, int NP) {
    const int ctx = NP + N_GEN + 32;
    dfl_model m;
    dfl_mtp h;
    if (model_open(&m, test_fixture(fixture), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    CHECK(mtp_open(&h, m.dir, &m, 0) == DFL_OK, "open: %s", dfl_errmsg());
    dfl_target_state s;
    CHECK(target_state_init(&s, &m, ctx, 33, 1) == DFL_OK, "state: %s", dfl_errmsg());
    CHECK(target_state_enable_tree(&s, 33) == DFL_OK, "tree: %s", dfl_errmsg());
    int32_t truth[N_GEN], out[N_GEN];
    dfl_gen_stats st;
    dfl_gen_opts ar = {.max_new = N_GEN, .ignore_eos = 1};
    CHECK(spec_generate(&s, NULL, prompt, NP, &ar, truth, &st, NULL, NULL) == DFL_OK, "ar: %s", dfl_errmsg());
    const struct { int block, budget; } runs[] = {{2, 0}, {4, 0}, {8, 0}, {4, 4}, {4, 16}, {8, 32}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        dfl_mtp_state ms;
        CHECK(mtp_state_init(&ms, &h, &m, ctx, runs[i].block) == DFL_OK, "mstate: %s", dfl_errmsg());
        dfl_draft_if dif = mtp_drafter_if(&ms);
        dfl_gen_opts o = {.max_new = N_GEN, .block = runs[i].block, .tree_budget = runs[i].budget, .ignore_eos = 1};
        target_state_reset(&s);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "spec: %s", dfl_errmsg());
        CHECK(st.generated == N_GEN && memcmp(out, truth, sizeof truth) == 0,
              "%s B=%d budget %d: MTP speculative output differs from greedy", fixture, runs[i].block, runs[i].budget);
        CHECK(st.accepted > 0, "%s B=%d budget %d: no draft accepted", fixture, runs[i].block, runs[i].budget);
        CHECK(ms.n_ctx == s.n_past, "%s B=%d budget %d: MTP context %d != committed %d", fixture, runs[i].block,
              runs[i].budget, ms.n_ctx, s.n_past);
        mtp_state_free(&ms);
    }
    /* the same context added in one call or position by position drafts the same logits */
    const int H = m.cfg.hidden, V = m.cfg.vocab, L = m.cfg.n_layers, B = 4;
    float feat[9 * 128], la[3 * 1024], lb[3 * 1024];
    CHECK(H <= 128 && V <= 1024 && NP <= 9, "fixture sizes");
    const int layer = L - 1;
    dfl_capture cap = {.n_layers = 1, .layers = &layer, .out = feat};
    target_state_reset(&s);
    CHECK(model_forward(&s, prompt, NP, NULL, 1, &cap) == DFL_OK, "prefill: %s", dfl_errmsg());
    dfl_mtp_state a, b;
    CHECK(mtp_state_init(&a, &h, &m, ctx, B) == DFL_OK && mtp_state_init(&b, &h, &m, ctx, B) == DFL_OK, "%s",
          dfl_errmsg());
    CHECK(mtp_add_context(&a, feat, prompt, NP) == DFL_OK, "%s", dfl_errmsg()); /* chunks of B rows inside */
    for (int p = 0; p < NP; p++)
        CHECK(mtp_add_context(&b, feat + (size_t)p * H, prompt + p, 1) == DFL_OK, "%s", dfl_errmsg());
    CHECK(mtp_draft(&a, truth[0], B, la) == DFL_OK && mtp_draft(&b, truth[0], B, lb) == DFL_OK, "%s", dfl_errmsg());
    CHECK(memcmp(la, lb, (size_t)(B - 1) * V * sizeof(float)) == 0, "chunked and per-position contexts differ");
    CHECK(mtp_draft(&a, V, B, la) == DFL_ERR, "an anchor outside the vocabulary is refused");
    mtp_state_free(&a);
    mtp_state_free(&b);
    target_state_free(&s);
    mtp_close(&h);
    model_close(&m);
}

int main(void) {
    argument_forms();
    refusals();
    const int32_t fit0[] = {11, 200, 37, 512, 99, 3, 641, 77, 12}, fit2[] = {300, 301, 302};
    lossless("qwen35_mtp", fit0, 9);
    lossless("qwen35_moe_mtp", fit2, 3); /* an MoE head: its layer's MLP is a sparse MoE block */
    return test_done("mtp");
}
