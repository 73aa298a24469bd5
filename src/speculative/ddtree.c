/* DDTree construction: best-first enumeration of the most probable draft prefixes. */
#include "dfl/ddtree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/kernels.h"

int ddtree_alloc(dfl_tree *t, int budget) {
    memset(t, 0, sizeof *t);
    if (budget < 1 || budget > DDTREE_MAX_NODES)
        return dfl_seterr("tree budget %d: must be in [1, %d]", budget, DDTREE_MAX_NODES);
    const size_t n = (size_t)budget + 1;
    t->token = malloc(n * sizeof *t->token);
    t->parent = malloc(n * sizeof *t->parent);
    t->depth = malloc(n * sizeof *t->depth);
    t->logp = malloc(n * sizeof *t->logp);
    t->rank = malloc(n * sizeof *t->rank);
    if (!t->token || !t->parent || !t->depth || !t->logp || !t->rank) {
        ddtree_free(t);
        return dfl_seterr("out of memory for a tree of %d nodes", budget);
    }
    return DFL_OK;
}

void ddtree_free(dfl_tree *t) {
    free(t->token), free(t->parent), free(t->depth), free(t->logp), free(t->rank);
    memset(t, 0, sizeof *t);
}

/* A candidate prefix: its parent node, depth, rank at that depth and log-probability. */
typedef struct cand {
    double logp;
    int parent, depth, rank;
} cand;

typedef struct build {
    const dfl_tree *t;
    cand *heap;
    int n;
} build;

/* Rank path comparison of (parent, rank) prefixes of equal depth: the ranks from the root. */
static int path_cmp(const dfl_tree *t, int pa, int ra, int pb, int rb) {
    if (pa == pb) return ra < rb ? -1 : ra > rb;
    int c = path_cmp(t, t->parent[pa], t->rank[pa], t->parent[pb], t->rank[pb]);
    return c ? c : (ra < rb ? -1 : ra > rb);
}

/* 1 if a comes before b in the tree order. */
static int before(const dfl_tree *t, const cand *a, const cand *b) {
    if (a->logp != b->logp) return a->logp > b->logp;
    if (a->depth != b->depth) return a->depth < b->depth;
    return path_cmp(t, a->parent, a->rank, b->parent, b->rank) < 0;
}

static void push(build *b, cand c) {
    int i = b->n++;
    b->heap[i] = c;
    while (i > 0 && before(b->t, &b->heap[i], &b->heap[(i - 1) / 2])) {
        cand tmp = b->heap[i];
        b->heap[i] = b->heap[(i - 1) / 2];
        b->heap[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static cand pop(build *b) {
    cand top = b->heap[0];
    b->heap[0] = b->heap[--b->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < b->n && before(b->t, &b->heap[l], &b->heap[m])) m = l;
        if (r < b->n && before(b->t, &b->heap[r], &b->heap[m])) m = r;
        if (m == i) break;
        cand tmp = b->heap[i];
        b->heap[i] = b->heap[m];
        b->heap[m] = tmp;
        i = m;
    }
    return top;
}

typedef struct scored {
    float p;
    int32_t id;
} scored;

/* 1 if a ranks before b: probability descending, then token id ascending. */
static int ranks_before(scored a, scored b) { return a.p != b.p ? a.p > b.p : a.id < b.id; }

static int scored_cmp(const void *a, const void *b) {
    const scored *x = a, *y = b;
    return ranks_before(*x, *y) ? -1 : ranks_before(*y, *x) ? 1 : 0;
}

/* The K best-ranked of V probabilities into out[0..K-1], best first: a size-K heap whose root
 * is the worst kept (O(V log K), not a sort of the vocabulary); the values that cannot enter are
 * skipped 16 at a time (kn_first_above). */
static void top_k(const float *p, int V, int K, scored *heap, scored *out) {
    int n = 0;
    for (int i = 0; i < V; i++) {
        /* once K are kept, only a larger p enters (an equal one has a larger id): skip to it */
        if (n == K && (i += kn_first_above(p + i, V - i, heap[0].p)) == V) break;
        scored c = {p[i], i};
        int j;
        if (n < K) { /* sift up from the end */
            j = n++;
            while (j > 0 && ranks_before(heap[(j - 1) / 2], c)) {
                heap[j] = heap[(j - 1) / 2];
                j = (j - 1) / 2;
            }
        } else { /* replace the root, sift down */
            j = 0;
            for (;;) {
                int l = 2 * j + 1, r = l + 1, w = j;
                scored wv = c;
                if (l < n && ranks_before(wv, heap[l])) w = l, wv = heap[l];
                if (r < n && ranks_before(wv, heap[r])) w = r;
                if (w == j) break;
                heap[j] = heap[w];
                j = w;
            }
        }
        heap[j] = c;
    }
    memcpy(out, heap, (size_t)n * sizeof *out);
    qsort(out, (size_t)n, sizeof *out, scored_cmp);
}

int ddtree_topk(const float *probs, int D, int V, int K, int32_t *top, double *toplp) {
    if (K < 1 || K > V) return dfl_seterr("tree: %d candidates per depth, must be in [1, %d]", K, V);
    scored *sc = malloc((size_t)2 * K * sizeof *sc);
    if (!sc) return dfl_seterr("out of memory building a tree");
    for (int d = 0; d < D; d++) {
        top_k(probs + (size_t)d * V, V, K, sc + K, sc);
        for (int r = 0; r < K; r++) {
            top[(size_t)d * K + r] = sc[r].id;
            toplp[(size_t)d * K + r] = log((double)sc[r].p);
        }
    }
    free(sc);
    return DFL_OK;
}

int ddtree_build_top(dfl_tree *t, int32_t anchor, const int32_t *top, const double *toplp, int D, int stride, int K,
                     int budget) {
    if (budget < 1 || budget > DDTREE_MAX_NODES)
        return dfl_seterr("tree budget %d: must be in [1, %d]", budget, DDTREE_MAX_NODES);
    if (D < 1) return dfl_seterr("tree: no draft positions");
    if (K < 1 || K > stride) return dfl_seterr("tree: %d candidates per depth of %d stored", K, stride);
    cand *heap = malloc((size_t)(2 * budget + 2) * sizeof *heap);
    if (!heap) return dfl_seterr("out of memory building a tree");
    t->n = 1;
    t->token[0] = anchor;
    t->parent[0] = -1;
    t->depth[0] = 0;
    t->logp[0] = 0;
    t->rank[0] = 0;
    t->max_depth = 0;
    build b = {.t = t, .heap = heap};
    push(&b, (cand){toplp[0], 0, 1, 0});
    while (t->n <= budget && b.n > 0) {
        cand c = pop(&b);
        const int i = t->n++;
        t->token[i] = top[(size_t)(c.depth - 1) * stride + c.rank];
        t->parent[i] = c.parent;
        t->depth[i] = c.depth;
        t->logp[i] = c.logp;
        t->rank[i] = (uint16_t)c.rank;
        if (c.depth > t->max_depth) t->max_depth = c.depth;
        const double base = t->logp[c.parent];
        if (c.rank + 1 < K) /* next sibling */
            push(&b, (cand){base + toplp[(size_t)(c.depth - 1) * stride + c.rank + 1], c.parent, c.depth, c.rank + 1});
        if (c.depth < D) /* first child */
            push(&b, (cand){c.logp + toplp[(size_t)c.depth * stride], i, c.depth + 1, 0});
    }
    free(heap);
    return DFL_OK;
}

int ddtree_build(dfl_tree *t, int32_t anchor, const float *probs, int D, int V, int budget) {
    if (budget < 1 || budget > DDTREE_MAX_NODES)
        return dfl_seterr("tree budget %d: must be in [1, %d]", budget, DDTREE_MAX_NODES);
    if (D < 1) return dfl_seterr("tree: no draft positions");
    const int K = budget < V ? budget : V; /* the top-N tokens per depth suffice */
    /* per depth: the K most probable tokens, probability descending then id ascending */
    int32_t *top = malloc((size_t)D * K * sizeof *top);
    double *toplp = malloc((size_t)D * K * sizeof *toplp);
    int rc = !top || !toplp ? dfl_seterr("out of memory building a tree") : ddtree_topk(probs, D, V, K, top, toplp);
    if (rc == DFL_OK) rc = ddtree_build_top(t, anchor, top, toplp, D, K, K, budget);
    free(top), free(toplp);
    return rc;
}
