/* Fuzz saved-features files (eval_features_load, what `dfl eval --features` reads) and replay
 * them (eval_replay) with a stand-in drafter: any file is refused with a message naming it, or
 * gives a truth whose fields agree (tokens <= max_new, a stop at max_new has max_new tokens, a row
 * per position but the last) and that every mode replays without reading past it (ASan). A file
 * whose metadata said stop max_new with fewer tokens once made the replay read past the truth.
 * Hidden size 4, feature layer 1, vocabulary 64 (the seeds of tests/fuzz/corpus/features). */
#include <math.h>
#include <string.h>

#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/kernels.h"
#include "dfl/replay.h"
#include "eval/features.h"
#include "fuzz_util.h"

enum { H = 4, V = 64 };

/* The kernels replay.c calls, scalar (the fuzz build compiles no kernels). */
int kn_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

void kn_softmax(float *x, int n) {
    float m = x[kn_argmax(x, n)], s = 0;
    for (int i = 0; i < n; i++) s += (x[i] = expf(x[i] - m));
    for (int i = 0; i < n; i++) x[i] /= s;
}

int kn_first_above(const float *x, int n, float t) {
    for (int i = 0; i < n; i++)
        if (x[i] > t) return i;
    return n;
}

/* No backends in the fuzz build: the replay's feature rows are host rows (feat.c). */
const dfl_backend *dfl_backend_of(dfl_device d) {
    (void)d;
    return NULL;
}

/* A drafter that holds only its context length and drafts logits from the anchor. */
typedef struct stub {
    int len;
} stub;

static int s_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    (void)feat, (void)tokens;
    ((stub *)ctx)->len += n;
    return DFL_OK;
}

static int s_draft(void *ctx, int32_t anchor, int B, float *logits) {
    (void)ctx;
    for (int k = 0; k < B - 1; k++)
        for (int v = 0; v < V; v++) logits[(size_t)k * V + v] = (float)((anchor * 7 + k * 3 + v * 5) % 11);
    return DFL_OK;
}

static int s_len(void *ctx) { return ((stub *)ctx)->len; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    static const int layer = 1;
    eval_truth t;
    FUZZ_CHECK(eval_truth_init(&t, H, &layer, 1) == DFL_OK, "eval_truth_init");
    eval_features_meta meta;
    dfl_clearerr();
    if (eval_features_load(path, &t, &meta, V) != DFL_OK) {
        FUZZ_CHECK(strstr(dfl_errmsg(), path) != NULL, "error does not name the file: %s", dfl_errmsg());
        eval_truth_free(&t);
        return 0;
    }
    FUZZ_CHECK(t.n >= 1 && t.n <= meta.max_new, "tokens %d, max_new %d", t.n, meta.max_new);
    FUZZ_CHECK(t.eos_stop || (t.n == meta.max_new && t.n_ext == 0), "stop max_new with %d of %d tokens", t.n,
               meta.max_new);
    FUZZ_CHECK(t.n_prompt >= 1 && t.n_rows == t.n_prompt + t.n - 1, "%d rows for %d + %d tokens", t.n_rows, t.n_prompt,
               t.n);
    for (int i = 0; i < t.n + t.n_ext; i++) FUZZ_CHECK(t.ids[i] >= 0 && t.ids[i] < V, "truth id %d", t.ids[i]);
    /* every mode replays the truth (or refuses it) without reading past it */
    static const int budgets[2] = {0, 4};
    const int blocks[3] = {2, 5, 16};
    for (int b = 0; b < 3; b++) {
        stub s = {0};
        dfl_draft_if dif = {.ctx = &s,
                            .add_context = s_add,
                            .draft = s_draft,
                            .context_len = s_len,
                            .feature_layers = &layer,
                            .n_feature_layers = 1};
        eval_draft_cache c;
        FUZZ_CHECK(eval_draft_cache_init(&c, 4, V, blocks[b]) == DFL_OK, "eval_draft_cache_init");
        eval_replay_out out[2];
        const int col = 0;
        if (eval_replay(&t, &dif, V, &col, blocks[b], meta.max_new, budgets, 2, &c, NULL, out) == DFL_OK) {
            for (int m = 0; m < 2; m++) {
                FUZZ_CHECK(out[m].st.generated == t.n, "mode %d generated %d of %d", m, out[m].st.generated, t.n);
                eval_replay_out_free(&out[m]);
            }
        }
        eval_draft_cache_free(&c);
    }
    eval_truth_free(&t);
    return 0;
}
