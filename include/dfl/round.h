/* Scoring a speculative round: the walk of its proposal (a chain of drafts or a DDTree) along
 * the target's choices, and the statistics the round adds. The online loop (spec.c) and replay
 * evaluation (replay.c) both score rounds here, so that they count alike. */
#ifndef DFL_ROUND_H
#define DFL_ROUND_H

#include <stdint.h>

#include "dfl/spec.h"

/* A round's proposal: node 0 is the anchor, nodes 1..n-1 the drafts. A plain decode step is the
 * anchor alone (n = 1). */
typedef struct dfl_proposal {
    const int32_t *token; /* [n] */
    const int *parent;    /* [n] DDTree: each node's parent, parents first; NULL: a chain (k after k - 1) */
    int n;
    int depth; /* the deepest draft: n - 1 for a chain, the tree's max_depth */
} dfl_proposal;

/* The target's token after node `node`, at depth `depth` of the walk: its argmax or its sample
 * online, the recorded truth in replay. *final = 1 makes it the round's last token even where a
 * child holds it (a resample after a rejected draft). */
typedef int32_t (*dfl_choice_fn)(void *ud, int node, int depth, int *final);

/* Walk p from the anchor: while the choice at the current node is a child's token, step to that
 * child (the first such). Asks choose once per node walked, in order (sampling choices consume
 * the RNG in that order). path[0..a] (room for p->depth + 1): the nodes walked, path[0] = 0;
 * *bonus: the choice at the last one. Returns a, the accepted drafts. */
int round_walk(const dfl_proposal *p, dfl_choice_fn choose, void *ud, int *path, int32_t *bonus);

/* Count in st a round of p that accepted a drafts: rounds, drafted, accepted, accept_hist, per
 * depth pos_drafted / pos_accepted; a tree's nodes and depth. */
void round_score(dfl_gen_stats *st, const dfl_proposal *p, int a);

#endif
