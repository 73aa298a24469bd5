/* One way to open every drafter (dfl/any_drafter.h): a DFlash drafter, a DFlash2 drafter, the
 * target's MTP head ('mtp') and another checkpoint's ('DIR:mtp') each open as their kind with the
 * default block (the drafter's block_size, DFL_MTP_DEFAULT_BLOCK for the head), name the feature
 * layers their dfl_draft_if reads, and decode greedily to the autoregressive tokens; a block
 * outside the drafter's range, a target without an MTP head and a missing directory are refused
 * with nothing left open. Block attention (drafter_set_causal and friends): the names both ways,
 * the setting and its source, back to the config's with AUTO, and the refusals (a value out of
 * range, a bidirectional window smaller than the block, anything but AUTO for an MTP head), each
 * leaving the setting as it was. Runs under ASan+UBSan too. */
#include <stdlib.h>
#include <string.h>

#include "dfl/any_drafter.h"
#include "dfl/common.h"
#include "testutil.h"

#define N_GEN 12

static void kinds(void) {
    char other_head[4096];
    snprintf(other_head, sizeof other_head, "%s:mtp", test_fixture("qwen35_mtp"));
    const struct {
        const char *target, *drafter;
        int block;
        dfl_drafter_kind kind;
        int default_block;
    } cases[] = {
        {"qwen35_vlm", "dflash_qwen35", 0, DFL_DRAFTER_DFLASH, 16},
        {"qwen35_vlm", "dflash2_qwen35", 0, DFL_DRAFTER_DFLASH2, 16},
        {"qwen35_vlm", "dflash2_qwen35", 5, DFL_DRAFTER_DFLASH2, 5},
        {"qwen35_mtp", "mtp", 0, DFL_DRAFTER_MTP, DFL_MTP_DEFAULT_BLOCK},
        {"qwen35_text", NULL, 3, DFL_DRAFTER_MTP, 3},
    };
    const int32_t prompt[] = {11, 200, 37, 512, 99, 3, 641, 77, 12};
    const int NP = (int)(sizeof prompt / sizeof prompt[0]), ctx = NP + N_GEN + 16;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *arg = !cases[i].drafter                      ? other_head
                          : strcmp(cases[i].drafter, "mtp") == 0 ? "mtp"
                                                                 : test_fixture(cases[i].drafter);
        char arg_copy[4096];
        snprintf(arg_copy, sizeof arg_copy, "%s", arg); /* test_fixture's buffer is reused */
        dfl_model m;
        if (model_open(&m, test_fixture(cases[i].target), 0) != DFL_OK) {
            CHECK(0, "%s", dfl_errmsg());
            continue;
        }
        dfl_any_drafter a;
        char warning[256];
        if (anydrafter_open(&a, arg_copy, &m, m.dir, cases[i].block, 0, warning, sizeof warning) != DFL_OK) {
            CHECK(0, "open %s: %s", arg_copy, dfl_errmsg());
            model_close(&m);
            continue;
        }
        CHECK(a.kind == cases[i].kind && a.block == cases[i].default_block && a.weight_bytes > 0 && !warning[0],
              "%s: kind %s, block %d, %llu bytes, warning '%s'", arg_copy, anydrafter_kind_name(a.kind), a.block,
              (unsigned long long)a.weight_bytes, warning);
        const int *ids;
        const int n_ids = anydrafter_feature_layers(&a, &ids);
        dfl_draft_if dif;
        dfl_target_state s;
        CHECK(target_state_init(&s, &m, ctx, NP > a.block ? NP : a.block, 1) == DFL_OK, "%s", dfl_errmsg());
        CHECK(anydrafter_state_init(&a, &m, ctx, &dif) == DFL_OK && anydrafter_state_bytes(&a) > 0, "%s", dfl_errmsg());
        CHECK(n_ids == dif.n_feature_layers && memcmp(ids, dif.feature_layers, (size_t)n_ids * sizeof *ids) == 0,
              "%s: the feature layers known at open are the interface's", arg_copy);
        CHECK(a.kind != DFL_DRAFTER_MTP || (n_ids == 1 && ids[0] == m.cfg.n_layers - 1),
              "the MTP head reads the last decoder layer");
        int32_t truth[N_GEN], out[N_GEN];
        dfl_gen_stats st;
        dfl_gen_opts ar = {.max_new = N_GEN, .ignore_eos = 1},
                     sp = {.max_new = N_GEN, .block = a.block, .ignore_eos = 1};
        CHECK(spec_generate(&s, NULL, prompt, NP, &ar, truth, &st, NULL, NULL) == DFL_OK, "%s", dfl_errmsg());
        target_state_reset(&s);
        CHECK(spec_generate(&s, &dif, prompt, NP, &sp, out, &st, NULL, NULL) == DFL_OK, "%s", dfl_errmsg());
        CHECK(memcmp(truth, out, sizeof truth) == 0 && st.rounds > 0, "%s: speculative output != greedy", arg_copy);
        target_state_free(&s);
        anydrafter_close(&a);
        model_close(&m);
    }
}

static void refusals(void) {
    dfl_model m;
    dfl_any_drafter a;
    char arg[4096];
    if (model_open(&m, test_fixture("qwen35_text"), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    CHECK(anydrafter_open(&a, "mtp", &m, m.dir, 0, 0, NULL, 0) == DFL_ERR && strstr(dfl_errmsg(), "drafter mtp: ") &&
              strstr(dfl_errmsg(), "has no MTP head: no mtp.* tensors"),
          "a target without an MTP head: %s", dfl_errmsg());
    snprintf(arg, sizeof arg, "%s:mtp", test_fixture("qwen35_mtp"));
    CHECK(anydrafter_open(&a, arg, &m, m.dir, 1, 0, NULL, 0) == DFL_ERR &&
              strstr(dfl_errmsg(), "block size 1: must be in [2, 256]"),
          "MTP block 1: %s", dfl_errmsg());
    snprintf(arg, sizeof arg, "%s", test_fixture("dflash2_qwen35"));
    CHECK(anydrafter_open(&a, arg, &m, m.dir, 17, 0, NULL, 0) == DFL_ERR &&
              strstr(dfl_errmsg(), "block size 17: must be in [2, 16]"),
          "block over block_size: %s", dfl_errmsg());
    CHECK(anydrafter_open(&a, "/nonexistent", &m, m.dir, 0, 0, NULL, 0) == DFL_ERR &&
              strstr(dfl_errmsg(), "/nonexistent: not a directory"),
          "missing drafter: %s", dfl_errmsg());
    snprintf(arg, sizeof arg, "%s", test_fixture("dflash_qwen3"));
    CHECK(anydrafter_open(&a, arg, &m, m.dir, 0, 0, NULL, 0) == DFL_ERR && strstr(dfl_errmsg(), "does not fit"),
          "another target's drafter: %s", dfl_errmsg());
    model_close(&m);
}

static void block_attn(void) {
    for (int c = DFL_BLOCK_ATTN_AUTO; c <= DFL_BLOCK_ATTN_CAUSAL; c++) {
        int back = 99;
        CHECK(drafter_causal_parse(drafter_causal_name(c), &back) == DFL_OK && back == c, "name of %d", c);
    }
    int v = 7;
    CHECK(drafter_causal_name(2) == NULL && drafter_causal_name(-3) == NULL, "names out of range");
    CHECK(drafter_causal_parse("Causal", &v) == DFL_ERR && v == 7 &&
              strstr(dfl_errmsg(), "expected auto, sliding-causal, bidirectional or causal, found 'Causal'"),
          "parse: %s", dfl_errmsg());
    dfl_model m;
    dfl_any_drafter a;
    if (model_open(&m, test_fixture("qwen35_mtp"), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    /* dflash_qwen35: S, S, F, window 4 < block 16, no is_causal */
    char arg[4096];
    snprintf(arg, sizeof arg, "%s", test_fixture("dflash_qwen35"));
    if (anydrafter_open(&a, arg, &m, m.dir, 0, 0, NULL, 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        model_close(&m);
        return;
    }
    const dfl_drafter *d = &a.d;
    CHECK(d->cfg.causal == -1 && drafter_has_sliding(d) == 2 && !strcmp(drafter_causal_source(d), "default") &&
              strstr(anydrafter_attn_semantics(&a), "sliding layers causal in the block (SpecForge/SGLang)"),
          "default: %d %s", d->cfg.causal, anydrafter_attn_semantics(&a));
    CHECK(anydrafter_set_causal(&a, 1) == DFL_OK && d->cfg.causal == 1 &&
              !strcmp(drafter_causal_source(d), "override") &&
              strstr(drafter_attn_semantics(d), "causal in every layer; set at run time"),
          "causal: %s", drafter_attn_semantics(d));
    CHECK(anydrafter_set_causal(&a, 0) == DFL_ERR && d->cfg.causal == 1 &&
              strstr(dfl_errmsg(), "sliding_window 4 is smaller than block_size 16 in sliding_attention layer 0"),
          "bidirectional window: %s", dfl_errmsg());
    CHECK(anydrafter_set_causal(&a, 2) == DFL_ERR && d->cfg.causal == 1 && strstr(dfl_errmsg(), "block attention 2"),
          "out of range: %s", dfl_errmsg());
    CHECK(anydrafter_set_causal(&a, DFL_BLOCK_ATTN_AUTO) == DFL_OK && d->cfg.causal == -1 && !d->causal_override &&
              !strcmp(drafter_causal_source(d), "default"),
          "auto: back to the config's");
    anydrafter_close(&a);
    CHECK(anydrafter_open(&a, "mtp", &m, m.dir, 0, 0, NULL, 0) == DFL_OK, "%s", dfl_errmsg());
    CHECK(anydrafter_set_causal(&a, DFL_BLOCK_ATTN_AUTO) == DFL_OK && anydrafter_attn_semantics(&a) == NULL,
          "MTP: auto is nothing to do");
    CHECK(anydrafter_set_causal(&a, 0) == DFL_ERR && strstr(dfl_errmsg(), "an MTP head"), "MTP: %s", dfl_errmsg());
    anydrafter_close(&a);
    model_close(&m);
}

int main(void) {
    kinds();
    refusals();
    block_attn();
    return test_done("any_drafter");
}
