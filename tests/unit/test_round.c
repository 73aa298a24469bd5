/* Round scoring (dfl/round.h): the walk of a chain and of a tree along given choices (the first
 * matching child, a final choice that ends the round on a matching child, a choice asked once
 * per node walked) and the statistics round_score adds. */
#include <string.h>

#include "dfl/round.h"
#include "testutil.h"

typedef struct script {
    const int32_t *choice; /* by depth */
    int final_at;          /* the depth whose choice is final (-1: none) */
    int asked[8], n_asked; /* nodes asked, in order */
} script;

static int32_t scripted(void *ud, int node, int depth, int *final) {
    script *s = ud;
    s->asked[s->n_asked++] = node;
    if (depth == s->final_at) *final = 1;
    return s->choice[depth];
}

static void chain(void) {
    const int32_t block[5] = {7, 1, 2, 3, 4};
    const dfl_proposal p = {.token = block, .n = 5, .depth = 4};
    int path[5];
    int32_t bonus;
    script s = {.choice = (const int32_t[]){1, 2, 9}, .final_at = -1};
    CHECK(round_walk(&p, scripted, &s, path, &bonus) == 2 && bonus == 9, "chain: two accepted, bonus 9");
    CHECK(s.n_asked == 3 && path[0] == 0 && path[1] == 1 && path[2] == 2, "chain: nodes 0, 1, 2 walked");
    script all = {.choice = (const int32_t[]){1, 2, 3, 4, 5}, .final_at = -1};
    CHECK(round_walk(&p, scripted, &all, path, &bonus) == 4 && bonus == 5 && all.n_asked == 5,
          "chain: every draft accepted, the bonus asked at the last node");
    script fin = {.choice = (const int32_t[]){1, 2}, .final_at = 1};
    CHECK(round_walk(&p, scripted, &fin, path, &bonus) == 1 && bonus == 2,
          "chain: a final choice ends the round even where it equals the draft");
    const dfl_proposal step = {.token = block, .n = 1};
    script one = {.choice = (const int32_t[]){5}, .final_at = -1};
    CHECK(round_walk(&step, scripted, &one, path, &bonus) == 0 && bonus == 5 && one.n_asked == 1,
          "a plain decode step: the anchor alone");
}

static void tree(void) {
    /* 0 -> {1:a=10, 2:b=11, 3:a'=10}; 1 -> {4:12}; 2 -> {5:13}; 3 -> {6:14} */
    const int32_t tok[7] = {7, 10, 11, 10, 12, 13, 14};
    const int parent[7] = {-1, 0, 0, 0, 1, 2, 3};
    const dfl_proposal p = {.token = tok, .parent = parent, .n = 7, .depth = 2};
    int path[3];
    int32_t bonus;
    script s = {.choice = (const int32_t[]){11, 13, 99}, .final_at = -1};
    CHECK(round_walk(&p, scripted, &s, path, &bonus) == 2 && bonus == 99, "tree: depth 2 via the second branch");
    CHECK(path[1] == 2 && path[2] == 5 && s.asked[1] == 2 && s.asked[2] == 5, "tree: path 0, 2, 5");
    script first = {.choice = (const int32_t[]){10, 14}, .final_at = -1};
    CHECK(round_walk(&p, scripted, &first, path, &bonus) == 1 && path[1] == 1 && bonus == 14,
          "tree: the first child holding the choice is taken");

    dfl_gen_stats st;
    memset(&st, 0, sizeof st);
    round_score(&st, &p, 1);
    const int32_t block[4] = {7, 1, 2, 3};
    round_score(&st, &(dfl_proposal){.token = block, .n = 4, .depth = 3}, 3);
    round_score(&st, &(dfl_proposal){.token = block, .n = 1}, 0);
    CHECK(st.rounds == 3 && st.drafted == 9 && st.accepted == 4, "score: rounds %d drafted %ld accepted %ld", st.rounds,
          st.drafted, st.accepted);
    CHECK(st.accept_hist[0] == 1 && st.accept_hist[1] == 1 && st.accept_hist[3] == 1, "score: histogram");
    CHECK(st.pos_drafted[1] == 2 && st.pos_drafted[2] == 2 && st.pos_drafted[3] == 1 && st.pos_accepted[1] == 2 &&
              st.pos_accepted[2] == 1 && st.pos_accepted[3] == 1,
          "score: per position");
    CHECK(st.tree_nodes == 6 && st.tree_depth_sum == 2, "score: only the tree's nodes and depth");
}

int main(void) {
    chain();
    tree();
    return test_done("test_round");
}
