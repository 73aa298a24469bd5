/* DDTree: the builder equals a brute-force enumeration of the top-N prefixes (ties included);
 * tree verification is exact — each node's logits from the tree forward equal those of
 * verifying its root-to-node path as a chain, bit for bit — and DDTree decoding is
 * token-identical to greedy decoding on dense, hybrid and MoE fixtures, including rounds whose
 * accepted path is not the first branch and full-depth acceptance. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/spec.h"
#include "testutil.h"

/* ---- builder vs brute force ------------------------------------------------------------ */

typedef struct prefix {
    double logp;
    int depth;
    int ranks[4];
    int32_t toks[4];
} prefix;

static int rank_of(const float *p, int V, int tok) { /* rank: probability desc, id asc */
    int r = 0;
    for (int i = 0; i < V; i++)
        if (p[i] > p[tok] || (p[i] == p[tok] && i < tok)) r++;
    return r;
}

static int prefix_cmp(const void *a, const void *b) {
    const prefix *x = a, *y = b;
    if (x->logp != y->logp) return x->logp > y->logp ? -1 : 1;
    if (x->depth != y->depth) return x->depth < y->depth ? -1 : 1;
    for (int i = 0; i < x->depth; i++)
        if (x->ranks[i] != y->ranks[i]) return x->ranks[i] < y->ranks[i] ? -1 : 1;
    return 0;
}

static void builder_vs_brute(unsigned seed, int V, int D, int ties) {
    float probs[4 * 8];
    srand(seed);
    for (int d = 0; d < D; d++) {
        float sum = 0;
        for (int i = 0; i < V; i++) {
            probs[d * V + i] = ties ? (float)(1 + rand() % 3) : (float)(rand() % 1000 + 1);
            sum += probs[d * V + i];
        }
        for (int i = 0; i < V; i++) probs[d * V + i] /= sum;
    }
    /* every prefix of depth 1..D, log-probabilities summed in the builder's order */
    int total = 0, cnt = V;
    for (int d = 0; d < D; d++, cnt *= V) total += cnt;
    prefix *all = calloc((size_t)total, sizeof *all);
    int k = 0;
    for (int d = 1; d <= D; d++) {
        int n = 1;
        for (int i = 0; i < d; i++) n *= V;
        for (int c = 0; c < n; c++) {
            prefix *p = &all[k++];
            p->depth = d;
            int x = c;
            for (int i = d - 1; i >= 0; i--) p->toks[i] = x % V, x /= V;
            double lp = 0;
            for (int i = 0; i < d; i++) {
                const double l = log((double)probs[i * V + p->toks[i]]);
                lp = i == 0 ? l : lp + l;
                p->ranks[i] = rank_of(probs + i * V, V, p->toks[i]);
            }
            p->logp = lp;
        }
    }
    qsort(all, (size_t)total, sizeof *all, prefix_cmp);
    int32_t *top = malloc((size_t)D * V * sizeof *top);
    double *toplp = malloc((size_t)D * V * sizeof *toplp);
    CHECK(ddtree_topk(probs, D, V, V, top, toplp) == DFL_OK, "topk: %s", dfl_errmsg());
    for (int budget = 1; budget <= total && budget <= DDTREE_MAX_BUDGET; budget += (budget < 20 ? 1 : 7)) {
        dfl_tree t;
        ddtree_alloc(&t, budget);
        CHECK(ddtree_build(&t, 42, probs, D, V, budget) == DFL_OK, "build: %s", dfl_errmsg());
        CHECK(t.n == budget + 1 && t.token[0] == 42 && t.parent[0] == -1, "tree size %d", t.n);
        int ok = 1;
        for (int i = 1; i < t.n && ok; i++) {
            /* node i must be the i-th prefix of the sorted enumeration */
            const prefix *p = &all[i - 1];
            int32_t path[4];
            int d = t.depth[i], x = i;
            for (int j = d - 1; j >= 0; j--) path[j] = t.token[x], x = t.parent[x];
            ok = d == p->depth && x == 0 && memcmp(path, p->toks, (size_t)d * sizeof(int32_t)) == 0 && t.parent[i] < i;
            if (!ok)
                CHECK(0, "seed %u V %d D %d ties %d budget %d: node %d differs from brute force", seed, V, D, ties,
                      budget, i);
        }
        /* one top-V list serves every budget (replay builds several budgets from one draft) */
        dfl_tree u;
        ddtree_alloc(&u, budget);
        const int K = budget < V ? budget : V;
        CHECK(ddtree_build_top(&u, 42, top, toplp, D, V, K, budget) == DFL_OK, "build_top: %s", dfl_errmsg());
        CHECK(u.n == t.n && u.max_depth == t.max_depth &&
                  memcmp(u.token, t.token, (size_t)t.n * sizeof *t.token) == 0 &&
                  memcmp(u.parent, t.parent, (size_t)t.n * sizeof *t.parent) == 0,
              "seed %u V %d budget %d: tree from a shared top list differs from ddtree_build", seed, V, budget);
        ddtree_free(&u);
        ddtree_free(&t);
    }
    free(top), free(toplp);
    free(all);
}

/* ---- exactness and losslessness on fixtures --------------------------------------------- */

#define NGEN 96
static int32_t prompt[] = {11, 200, 37, 512, 99, 3, 641, 77, 12};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

typedef struct oracle {
    const int32_t *truth;
    int n_prompt, n_ctx, round, V, mode;
} oracle;

static int o_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    (void)feat, (void)tokens;
    ((oracle *)ctx)->n_ctx += n;
    return DFL_OK;
}
static int o_len(void *ctx) { return ((oracle *)ctx)->n_ctx; }

/* The truth gets rank 0 everywhere (full acceptance), or rank 1 behind a decoy at one depth,
 * so the accepted path leaves the first branch there. */
static int o_draft(void *ctx, int32_t anchor, int B, float *logits) {
    oracle *o = ctx;
    (void)anchor;
    const int n_out = o->n_ctx - o->n_prompt + 1, decoy_depth = o->mode ? 1 + o->round % (B - 1) : 0;
    o->round++;
    memset(logits, 0, (size_t)(B - 1) * o->V * sizeof(float));
    for (int k = 1; k < B; k++) {
        const int32_t t = n_out - 1 + k < NGEN ? o->truth[n_out - 1 + k] : 0;
        logits[(size_t)(k - 1) * o->V + t] = 20.0f;
        if (k == decoy_depth) logits[(size_t)(k - 1) * o->V + (t + 1) % o->V] = 21.0f;
    }
    return DFL_OK;
}

static void tree_exact(const char *target, const char *drafter) {
    dfl_model m;
    dfl_drafter d;
    if (model_open(&m, test_fixture(target), 0) || drafter_open(&d, test_fixture(drafter), m.cfg.n_layers)) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    const int V = m.cfg.vocab, B = d.cfg.block_size, N = 24;
    dfl_target_state s, c;
    CHECK(target_state_init(&s, &m, NP + N + 2, N + 1, 1) == DFL_OK && target_state_enable_tree(&s, N + 1) == DFL_OK,
          "tree state");
    CHECK(target_state_init(&c, &m, NP + N + 2, N + 1, 0) == DFL_OK, "chain state");
    dfl_drafter_state ds;
    CHECK(drafter_state_init(&ds, &d, &m, NP + N + 2, B) == DFL_OK, "dstate");
    /* drafter distributions for the block after the prompt */
    float *logits = malloc((size_t)(N + 1) * V * sizeof(float)), *cl = malloc((size_t)V * sizeof(float));
    float *dl = malloc((size_t)B * V * sizeof(float));
    int layers[8];
    for (int i = 0; i < d.cfg.n_target_ids; i++) layers[i] = d.cfg.target_layer_ids[i];
    float *feat = malloc((size_t)NP * d.cfg.n_target_ids * m.cfg.hidden * sizeof(float));
    dfl_capture cap = {.n_layers = d.cfg.n_target_ids, .layers = layers, .out = feat};
    model_forward(&s, prompt, NP, logits, 1, &cap);
    drafter_add_context(&ds, feat, NP);
    const int32_t anchor = kn_argmax(logits, V);
    drafter_draft(&ds, anchor, B, dl);
    for (int k = 0; k < B - 1; k++) kn_softmax(dl + (size_t)k * V, V);
    dfl_tree t;
    ddtree_alloc(&t, N);
    CHECK(ddtree_build(&t, anchor, dl, B - 1, V, N) == DFL_OK, "build");
    CHECK(model_forward_tree(&s, t.token, t.parent, t.n, logits, NULL) == DFL_OK, "tree forward: %s", dfl_errmsg());
    int exact = 1;
    for (int i = 0; i < t.n; i++) {
        int32_t path[64];
        int dep = t.depth[i], x = i;
        for (int j = dep; j >= 0; j--) path[j] = t.token[x], x = t.parent[x];
        target_state_reset(&c);
        model_forward(&c, prompt, NP, NULL, 0, NULL);
        model_forward(&c, path, dep + 1, cl, 1, NULL);
        exact &= memcmp(cl, logits + (size_t)i * V, (size_t)V * sizeof(float)) == 0;
    }
    CHECK(exact, "%s: tree node logits differ from verifying the node's path as a chain", target);
    /* committing a path leaves the state of a chain run over it: a path ending at a node with
     * children (its linear-layer states kept by the forward) and one ending at a leaf (its
     * states recomputed at the commit from its parent's) */
    int path[64], len = 0;
    int32_t toks[64], next = 5;
    /* a path through a node that is not its successor's parent is refused (and leaves the tree
     * committable) */
    for (int y = 0, done = 0; y < t.n && !done; y++)
        for (int q = 1; q < t.n && t.depth[y] == 2 && !done; q++)
            if (t.depth[q] == 1 && q != t.parent[y] && q < y) {
                const int bad[3] = {0, q, y};
                CHECK(target_state_tree_commit(&s, bad, 3) == DFL_ERR, "%s: a commit through a non-parent must fail",
                      target);
                done = 1;
            }
    for (int leaf = 0; leaf < 2; leaf++) {
        int end = -1; /* the deepest node with (leaf = 0) or without (leaf = 1) children */
        for (int i = t.n - 1; i >= 0 && end < 0; i--) {
            int kids = 0;
            for (int j = i + 1; j < t.n; j++) kids += t.parent[j] == i;
            if ((kids > 0) != leaf) end = i;
        }
        CHECK(end >= 0 && t.depth[end] >= 1, "%s: the tree has no %s below the root", target,
              leaf ? "leaf" : "inner node");
        if (end < 0) break;
        len = t.depth[end] + 1;
        for (int k = len - 1, x = end; k >= 0; k--) path[k] = x, x = t.parent[x];
        if (leaf) { /* a fresh tree forward: the first commit used up the last one */
            target_state_reset(&s);
            model_forward(&s, prompt, NP, NULL, 0, NULL);
            CHECK(model_forward_tree(&s, t.token, t.parent, t.n, logits, NULL) == DFL_OK, "tree forward: %s",
                  dfl_errmsg());
        }
        CHECK(target_state_tree_commit(&s, path, len) == DFL_OK, "commit: %s", dfl_errmsg());
        for (int k = 0; k < len; k++) toks[k] = t.token[path[k]];
        target_state_reset(&c);
        model_forward(&c, prompt, NP, NULL, 0, NULL);
        model_forward(&c, toks, len, NULL, 0, NULL);
        model_forward(&c, &next, 1, cl, 1, NULL);
        model_forward(&s, &next, 1, logits, 1, NULL);
        CHECK(memcmp(cl, logits, (size_t)V * sizeof(float)) == 0,
              "%s: state after a tree commit ending at a %s != chain", target, leaf ? "leaf" : "node with children");
    }
    CHECK(target_state_tree_commit(&s, path, len) == DFL_ERR, "a second commit must fail");
    int badparent[2] = {-1, 1};
    CHECK(model_forward_tree(&s, toks, badparent, 2, NULL, NULL) == DFL_ERR, "parent after child must fail");
    ddtree_free(&t);
    free(logits), free(cl), free(dl), free(feat);
    drafter_state_free(&ds);
    target_state_free(&s);
    target_state_free(&c);
    drafter_close(&d);
    model_close(&m);
}

/* A tree deeper than the per-thread state stacks first hold (a chain of 40 nodes, then one of
 * 70 after a shallow one): the stacks grow, and the last node's logits and the state after
 * committing the whole path equal a chain's. */
static void tree_deep(const char *target) {
    dfl_model m;
    if (model_open(&m, test_fixture(target), 0)) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    enum { N = 70 };
    const int V = m.cfg.vocab;
    dfl_target_state s, c;
    CHECK(target_state_init(&s, &m, NP + N + 2, N, 1) == DFL_OK && target_state_enable_tree(&s, N) == DFL_OK,
          "tree state");
    CHECK(target_state_init(&c, &m, NP + N + 2, N, 0) == DFL_OK, "chain state");
    float *logits = malloc((size_t)N * V * sizeof(float)), *cl = malloc((size_t)V * sizeof(float));
    int32_t toks[N], next = 7;
    int parent[N], path[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 37 + 5) % V), parent[i] = i - 1, path[i] = i;
    static const int lens[] = {40, 3, N};
    for (int k = 0; k < 3; k++) {
        const int n = lens[k];
        target_state_reset(&s), target_state_reset(&c);
        model_forward(&s, prompt, NP, NULL, 0, NULL);
        model_forward(&c, prompt, NP, NULL, 0, NULL);
        CHECK(model_forward_tree(&s, toks, parent, n, logits, NULL) == DFL_OK, "deep tree: %s", dfl_errmsg());
        for (int t = 0; t < n; t += 32) /* as verifications: 64 tokens and more would run the chunked form */
            model_forward(&c, toks + t, n - t < 32 ? n - t : 32, cl, 1, NULL);
        CHECK(memcmp(cl, logits + (size_t)(n - 1) * V, (size_t)V * sizeof(float)) == 0,
              "%s: the last node of a %d-deep tree differs from the chain", target, n);
        CHECK(target_state_tree_commit(&s, path, n) == DFL_OK, "commit: %s", dfl_errmsg());
        model_forward(&c, &next, 1, cl, 1, NULL);
        model_forward(&s, &next, 1, logits, 1, NULL);
        CHECK(memcmp(cl, logits, (size_t)V * sizeof(float)) == 0, "%s: state after committing a %d-deep tree != chain",
              target, n);
    }
    free(logits), free(cl);
    target_state_free(&s);
    target_state_free(&c);
    model_close(&m);
}

static void tree_lossless(const char *target, const char *drafter) {
    dfl_model m;
    dfl_drafter d;
    if (model_open(&m, test_fixture(target), 0) || drafter_open(&d, test_fixture(drafter), m.cfg.n_layers)) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    const int budgets[] = {1, 8, 64};
    const int maxN = 64, ctx = NP + NGEN + maxN + 1;
    dfl_target_state s;
    CHECK(target_state_init(&s, &m, ctx, maxN + 1, 1) == DFL_OK && target_state_enable_tree(&s, maxN + 1) == DFL_OK,
          "state: %s", dfl_errmsg());
    int32_t truth[NGEN], out[NGEN];
    dfl_gen_stats st;
    dfl_gen_opts ar = {.max_new = NGEN, .ignore_eos = 1};
    spec_generate(&s, NULL, prompt, NP, &ar, truth, &st, NULL, NULL);
    for (int bi = 0; bi < 3; bi++) {
        dfl_drafter_state ds;
        drafter_state_init(&ds, &d, &m, ctx, d.cfg.block_size);
        dfl_draft_if dif = spec_dflash_drafter(&ds);
        dfl_gen_opts o = {.max_new = NGEN, .block = d.cfg.block_size, .ignore_eos = 1, .tree_budget = budgets[bi]};
        target_state_reset(&s);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "ddtree: %s", dfl_errmsg());
        CHECK(memcmp(out, truth, sizeof truth) == 0, "%s DDTree-%d (random drafter): output differs from greedy",
              target, budgets[bi]);
        drafter_state_free(&ds);
    }
    /* oracles: full-depth acceptance; and the truth behind a decoy (accepted path off the first branch) */
    for (int mode = 0; mode < 2; mode++) {
        for (int B = 4; B <= 16; B += 12) {
            double tau[2];
            for (int tree = 0; tree < 2; tree++) {
                oracle orc = {.truth = truth, .n_prompt = NP, .V = m.cfg.vocab, .mode = mode};
                int layer0 = 0;
                dfl_draft_if dif = {.ctx = &orc,
                                    .add_context = o_add,
                                    .draft = o_draft,
                                    .context_len = o_len,
                                    .feature_layers = &layer0,
                                    .n_feature_layers = 1};
                dfl_gen_opts o = {.max_new = NGEN, .block = B, .ignore_eos = 1, .tree_budget = tree ? 32 : 0};
                target_state_reset(&s);
                CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "oracle: %s",
                      dfl_errmsg());
                CHECK(memcmp(out, truth, sizeof truth) == 0, "%s oracle mode %d B %d tree %d: differs from greedy",
                      target, mode, B, tree);
                tau[tree] = spec_tau(&st);
                if (mode == 0 && tree)
                    CHECK(st.accept_hist[B - 1] > 0, "%s: no full-depth acceptance with B %d", target, B);
            }
            if (mode == 1)
                CHECK(tau[1] > tau[0] + 0.5,
                      "%s B %d: the tree (tau %.2f) should beat the chain (tau %.2f) when the "
                      "truth is the second branch",
                      target, B, tau[1], tau[0]);
        }
    }
    /* bad input */
    dfl_gen_opts o = {.max_new = 4, .block = 4, .ignore_eos = 1, .tree_budget = DDTREE_MAX_BUDGET + 1};
    dfl_drafter_state ds;
    drafter_state_init(&ds, &d, &m, ctx, 4);
    dfl_draft_if dif = spec_dflash_drafter(&ds);
    target_state_reset(&s);
    CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_ERR && strstr(dfl_errmsg(), "budget"),
          "budget too large: %s", dfl_errmsg());
    o.tree_budget = 4;
    o.temperature = 1.0f;
    CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_ERR && strstr(dfl_errmsg(), "greedy"),
          "tree with sampling: %s", dfl_errmsg());
    drafter_state_free(&ds);
    target_state_free(&s);
    drafter_close(&d);
    model_close(&m);
}

int main(void) {
    for (unsigned seed = 1; seed <= 6; seed++) {
        builder_vs_brute(seed, 5, 3, 0);
        builder_vs_brute(seed, 4, 3, 1); /* many exact ties */
        builder_vs_brute(seed, 3, 4, 1);
    }
    dfl_tree t;
    CHECK(ddtree_alloc(&t, 0) == DFL_ERR && ddtree_alloc(&t, DDTREE_MAX_NODES + 1) == DFL_ERR, "budget bounds");
    tree_exact("qwen3_tiny", "dflash_qwen3");
    tree_exact("qwen35_vlm", "dflash_qwen35");
    tree_exact("qwen3_moe", "dflash_qwen3");
    tree_exact("qwen35_moe_vlm", "dflash_qwen35_moe");
    tree_deep("qwen35_text");
    tree_lossless("qwen3_tiny", "dflash_qwen3");
    tree_lossless("qwen35_vlm", "dflash_qwen35");
    tree_lossless("qwen3_moe", "dflash_qwen3");
    tree_lossless("qwen35_moe_vlm", "dflash_qwen35_moe");
    return test_done("test_ddtree");
}
