/* Round scoring shared by the online loop and replay evaluation (include/dfl/round.h). */
#include "dfl/round.h"

int round_walk(const dfl_proposal *p, dfl_choice_fn choose, void *ud, int *path, int32_t *bonus) {
    int a = 0, cur = 0;
    path[0] = 0;
    for (;;) {
        int final = 0;
        *bonus = choose(ud, cur, a, &final);
        if (final) break;
        int next = -1;
        if (!p->parent) {
            if (cur + 1 < p->n && p->token[cur + 1] == *bonus) next = cur + 1;
        } else {
            for (int i = cur + 1; i < p->n && next < 0; i++)
                if (p->parent[i] == cur && p->token[i] == *bonus) next = i;
        }
        if (next < 0) break;
        path[++a] = cur = next;
    }
    return a;
}

void round_score(dfl_gen_stats *st, const dfl_proposal *p, int a) {
    st->rounds++;
    st->drafted += p->n - 1;
    st->accepted += a;
    st->accept_hist[a]++;
    for (int k = 1; k <= p->depth; k++) {
        st->pos_drafted[k]++;
        if (k <= a) st->pos_accepted[k]++;
    }
    if (p->parent) {
        st->tree_nodes += p->n - 1;
        st->tree_depth_sum += p->depth;
    }
}
