/* A drafter as the speculative loop sees it (dfl_draft_if), apart from any drafter's model: the
 * DFlash drafter (spec_dflash_drafter, dfl/spec.h), the target's MTP head (mtp_drafter_if,
 * dfl/mtp.h) and test oracles all fill one. */
#ifndef DFL_DRAFT_H
#define DFL_DRAFT_H

#include <stdint.h>

#define DFL_MAX_BLOCK 256

struct dfl_feat;

/* A draft as the loops read it, per row k < B-1 of its logits: argmax[k] (kn_argmax of the row)
 * and, with K > 0, the K most probable tokens of the row's softmax, most probable first (ties: the
 * lower id), with their log-probabilities: top / toplp [B-1][K] (ddtree_topk's). A chain reads
 * argmax, a DDTree top / toplp, a replay's draft cache both. */
typedef struct dfl_draft_top {
    int K;
    int32_t *argmax;
    int32_t *top;
    double *toplp;
} dfl_draft_top;

/* A drafter as the loop sees it: B-1 distributions per round from the committed context. The
 * DFlash drafter is one (spec_dflash_drafter), the target's MTP head another (mtp_drafter_if,
 * dfl/mtp.h); tests plug in others (e.g. an oracle that proposes known continuations). */
typedef struct dfl_draft_if {
    void *ctx;
    /* Append newly committed positions: rows 0..n-1 of feat (width n_feat*H) the target's
     * features there, where the target's backend keeps them (a drafter elsewhere reads them,
     * dfl_feat_host_rows); tokens [n] the tokens at those positions (the inputs the features were
     * computed from). A drafter that pairs a hidden state with the token after it (the MTP head)
     * takes the next token from the next call or from the anchor. */
    int (*add_context)(void *ctx, const struct dfl_feat *feat, const int32_t *tokens, int n);
    /* Draft a block of B tokens starting with anchor: logits [B-1, V]. */
    int (*draft)(void *ctx, int32_t anchor, int B, float *logits);
    /* Optional (NULL: the loop summarizes draft()'s logits, dfl_draft_topk): the block drafted and
     * summarized where the drafter runs, so a drafter on a device sends back K ids a row, not V
     * logits; logits [B-1, V] are filled too when not NULL (on request: a sampled draft needs q). */
    int (*draft_top)(void *ctx, int32_t anchor, int B, const dfl_draft_top *out, float *logits);
    /* Optional (NULL: argmax of draft()'s logits): each row's argmax alone, ids [B-1], the same
     * ids; scratch [B-1, V] (a chain's greedy draft, where the drafter's lm_head finds the
     * argmax without every row: drafter_draft_ids). */
    int (*draft_ids)(void *ctx, int32_t anchor, int B, int32_t *ids, float *scratch);
    /* Optional (NULL: one block at a time): n blocks in one forward, block b drafted as draft()
     * would on a context of starts[b] <= context_len positions: logits [n * (B-1), V]. */
    int (*draft_many)(void *ctx, const int32_t *anchors, const int *starts, int n, int B, float *logits);
    /* Optional (NULL: one context at a time): draft_many over n contexts of this same drafter,
     * block b on ctxs[b] (the ctx of another dfl_draft_if of the drafter) at starts[b] <= its
     * length: one forward for blocks of many prompts. logits [n * (B-1), V]. */
    int (*draft_across)(void *const *ctxs, const int32_t *anchors, const int *starts, int n, int B, float *logits);
    /* Optional: draft_across's rows' argmaxes alone, ids [n * (B-1)], as draft_ids (scratch
     * [n * (B-1), V]). */
    int (*draft_across_ids)(void *const *ctxs, const int32_t *anchors, const int *starts, int n, int B, int32_t *ids,
                            float *scratch);
    /* Positions whose features the drafter holds (must equal the committed length). */
    int (*context_len)(void *ctx);
    /* Optional (NULL: always draft): asked before each round; nonzero makes the round a plain
     * decode step (the features still reach add_context). Lossless either way; lets a recording
     * decode where drafting does not pay. */
    int (*skip)(void *ctx);
    /* Optional: empty the context (a state reused over prompts, as eval does). */
    void (*reset)(void *ctx);
    const int *feature_layers; /* target decoder layers whose outputs make a feature */
    int n_feature_layers;
} dfl_draft_if;

/* out from D rows of logits [D, V], the rows in parallel; probs [D, V]: scratch for K > 0 (may be
 * logits itself, which is then overwritten by the softmax). */
int dfl_draft_summarize(const float *logits, int D, int V, float *probs, const dfl_draft_top *out);

/* Drafter d's block of B tokens from anchor, summarized into out: by d->draft_top where the
 * drafter has it, for a chain (K 0) without want_logits by d->draft_ids where it has it (logits
 * scratch), else by draft() into logits [B-1, V] and dfl_draft_summarize (probs as there).
 * want_logits: logits must hold the draft's logits afterwards (with K > 0 then probs != logits). */
int dfl_draft_topk(const dfl_draft_if *d, int32_t anchor, int B, int V, const dfl_draft_top *out, float *logits,
                   int want_logits, float *probs);

#endif
