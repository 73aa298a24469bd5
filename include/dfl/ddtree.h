/* DDTree (Ringel & Romano 2026, docs/design.md §6): the best tree of N draft nodes for a block drafter
 * is its N most probable prefixes under the factorized per-position distributions. */
#ifndef DFL_DDTREE_H
#define DFL_DDTREE_H

#include <stdint.h>

/* Largest tree budget dfl verifies on the target: per-node linear-attention inputs make memory
 * grow with it (docs/ddtree.md gives the figures). */
#define DDTREE_MAX_BUDGET 256
/* Largest tree the builder makes: replay evaluation (docs/eval.md) builds trees that the target
 * never runs, so their budget is bounded by the builder alone. */
#define DDTREE_MAX_NODES 4096

typedef struct dfl_tree {
    int n;          /* nodes, root included (n - 1 = draft nodes) */
    int32_t *token; /* [n] token of each node; node 0 is the root (the anchor) */
    int *parent;    /* [n] parent node (-1 for the root); parents precede children */
    int *depth;     /* [n] 0 for the root */
    double *logp;   /* [n] log-probability of the node's prefix under the drafter */
    uint16_t *rank; /* [n] rank of the node's token among its depth's candidates */
    int max_depth;  /* deepest node */
} dfl_tree;

/* Allocate a tree for up to budget draft nodes (<= DDTREE_MAX_NODES). */
int ddtree_alloc(dfl_tree *t, int budget);
void ddtree_free(dfl_tree *t);

/* Build the tree of the `budget` most probable prefixes (best-first over a max-heap seeded
 * with depth 1's most probable token; each pop adds a node and pushes its next sibling and
 * its first child). probs: [D, V] the drafter's distributions for depths 1..D (rows sum to 1).
 * Order: log-probability descending; ties by depth ascending, then by the rank path (ranks of
 * the tokens along the prefix, ranks by probability descending then token id ascending)
 * lexicographically ascending. The root gets token `anchor`. */
int ddtree_build(dfl_tree *t, int32_t anchor, const float *probs, int D, int V, int budget);

/* The two halves of ddtree_build, for callers that build several budgets from one draft:
 * ddtree_topk: per depth the K most probable tokens, best first (probability descending, then
 * id ascending): top/toplp [D, K], log-probabilities in double. The first k <= K of a row are
 * that row's top k, so one call with the largest K serves every smaller budget.
 * ddtree_build_top: the tree from such lists, rows `stride` apart, using the first K of each
 * (K = min(budget, V) gives ddtree_build's tree exactly). */
int ddtree_topk(const float *probs, int D, int V, int K, int32_t *top, double *toplp);
int ddtree_build_top(dfl_tree *t, int32_t anchor, const int32_t *top, const double *toplp, int D, int stride, int K,
                     int budget);

#endif
