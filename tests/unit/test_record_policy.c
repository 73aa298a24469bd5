/* --record-mode auto: the recorder's choice between a speculative round and a plain decode step,
 * driven through its dfl_draft_if with a stand-in drafter and fixed costs (no timing): a drafter
 * whose drafts are never accepted is measured for two rounds, then the recording decodes, with a
 * speculative probe every EVAL_RECORD_PROBE steps; a drafter that commits many tokens per round
 * keeps speculating; acceptance that rises is noticed at the next probe; every context update
 * reaches the wrapped drafter and the truth. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/replay.h"
#include "testutil.h"

enum { H = 4, V = 8, B = 16, NP = 5 };

typedef struct inner {
    int n_ctx, drafts;
} inner;

static int in_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    (void)feat, (void)tokens;
    ((inner *)ctx)->n_ctx += n;
    return DFL_OK;
}
static int in_draft(void *ctx, int32_t anchor, int bs, float *logits) {
    (void)anchor;
    memset(logits, 0, (size_t)(bs - 1) * V * sizeof(float));
    ((inner *)ctx)->drafts++;
    return DFL_OK;
}
static int in_len(void *ctx) { return ((inner *)ctx)->n_ctx; }

static const int layers[1] = {0};

/* Run `rounds` rounds; tokens(i) = tokens the i-th speculative round commits. Writes the
 * sequence of choices ('S' speculate, 'D' decode) into seq. */
static void run(const eval_costs *costs, int (*tokens)(int), int rounds, char *seq) {
    inner in = {0};
    dfl_draft_if base = {.ctx = &in,
                         .add_context = in_add,
                         .draft = in_draft,
                         .context_len = in_len,
                         .feature_layers = layers,
                         .n_feature_layers = 1};
    eval_truth t;
    eval_truth_init(&t, H, layers, 1);
    eval_recorder rec;
    CHECK(eval_recorder_init(&rec, base, &t, NULL, V) == DFL_OK, "recorder init: %s", dfl_errmsg());
    eval_recorder_adapt(&rec, costs, B);
    rec.n_prompt = NP;
    dfl_draft_if d = eval_recorder_if(&rec);
    CHECK(d.skip != NULL, "an adaptive recorder offers skip");
    float feat[B * H] = {0}, logits[(B - 1) * V];
    const int32_t toks[NP > B ? NP : B] = {0};
    const dfl_feat fv = dfl_feat_view(feat, B, H);
    d.add_context(d.ctx, &fv, toks, NP); /* the prefill */
    int spec = 0, committed = NP;
    for (int i = 0; i < rounds; i++) {
        if (d.skip(d.ctx)) {
            seq[i] = 'D';
            d.add_context(d.ctx, &fv, toks, 1);
            committed += 1;
        } else {
            seq[i] = 'S';
            d.draft(d.ctx, 0, B, logits);
            const int n = tokens(spec++);
            d.add_context(d.ctx, &fv, toks, n);
            committed += n;
        }
    }
    seq[rounds] = 0;
    CHECK(in.n_ctx == committed && t.n_rows == committed, "context updates: inner %d, truth %d, committed %d", in.n_ctx,
          t.n_rows, committed);
    CHECK(in.drafts == spec, "drafts %d for %d speculative rounds", in.drafts, spec);
    eval_recorder_free(&rec);
    eval_truth_free(&t);
}

static int none(int i) { return (void)i, 1; }
static int many(int i) { return (void)i, 7; }
static int rising(int i) { return i < 3 ? 1 : 7; } /* useless for 3 rounds, then good */

int main(void) {
    /* a decode step 1 s, a 16-token verification 1.5 s: speculation pays from 1.5 tokens a round */
    eval_costs c = {.ok = 1, .n_chain = 2, .chain_n = {1, B}, .chain_s = {1.0, 1.5}};
    char seq[128];
    run(&c, none, 40, seq);
    CHECK(strncmp(seq, "SS", 2) == 0, "two rounds measure speculation first: %s", seq);
    int probes = 0, decodes = 0;
    for (int i = 2; i < 40; i++) probes += seq[i] == 'S', decodes += seq[i] == 'D';
    CHECK(decodes == 36 && probes == 2 && seq[2 + EVAL_RECORD_PROBE - 1] == 'S',
          "a useless drafter: decode steps with a probe every %d: %s", EVAL_RECORD_PROBE, seq);
    run(&c, many, 40, seq);
    CHECK(strspn(seq, "S") == 40, "7 tokens a round: always speculate: %s", seq);
    run(&c, rising, 60, seq);
    /* the first probe still sees 1 token; the second sees 7 and speculation resumes for good */
    const char *last_d = strrchr(seq, 'D');
    CHECK(last_d && last_d - seq == 2 + 2 * EVAL_RECORD_PROBE - 2 && strlen(last_d + 1) > 20,
          "acceptance that rises: speculation resumes after a probe: %s", seq);
    /* without measured costs the recorder times the rounds itself: it still starts speculating */
    run(NULL, many, 10, seq);
    CHECK(strncmp(seq, "SSD", 3) == 0, "no costs: two speculative rounds, one timed decode step: %s", seq);
    return test_done("record_policy");
}
