/* Generation: autoregressive, and DFlash speculative decoding with chain verification
 * (docs/design.md §5), greedy or sampled, lossless. */
#ifndef DFL_SPEC_H
#define DFL_SPEC_H

#include <stdint.h>
#include <stdio.h>

#include "dfl/draft.h"
#include "dfl/drafter.h"
#include "dfl/model.h"

/* Wrap a DFlash drafter state. */
dfl_draft_if spec_dflash_drafter(dfl_drafter_state *ds);

/* Acceptance at temperature > 0 (both lossless: every committed token is distributed as the
 * target's sample): DFL_ACCEPT_PQ, speculative sampling — drafts sampled from the drafter's q,
 * accepted with min(1, p/q), the first rejection resampled from norm(max(0, p - q));
 * DFL_ACCEPT_MATCH, the original DFlash generate loop's rule — greedy drafts, each position's token sampled from
 * the target's p, drafts accepted while they equal it, the first sample that differs is the
 * bonus. At temperature 0 both are greedy verification.
 * With top_k / top_p (dfl_gen_opts), p is the target's distribution as served: softmax(logits / T),
 * then top-k, then top-p over the renormalised survivors, renormalised (spec_sampling_filter).
 * The output is distributed as sampling that p autoregressively. The pq rule filters the
 * drafter's q the same way: drafts come from where p can put mass, and min(1, p/q) and the
 * residual keep the output exact for any q, filtered or not. */
typedef enum dfl_accept_rule { DFL_ACCEPT_PQ = 0, DFL_ACCEPT_MATCH = 1 } dfl_accept_rule;

/* "pq" / "match"; parse: -1 if neither. */
const char *spec_accept_rule_name(dfl_accept_rule r);
int spec_accept_rule_parse(const char *s);

typedef struct dfl_gen_opts {
    int max_new;       /* tokens to generate at most */
    int block;         /* block size B (verification width); ignored without a drafter */
    int tree_budget;   /* 0 = chain verification; N > 0 = DDTree with N draft nodes (greedy only) */
    float temperature; /* 0 = greedy */
    /* Sampling filters at temperature > 0 (ignored when greedy: the argmax always survives them):
     * keep the top_k most probable tokens (0 = off), then the smallest most-probable-first set
     * whose mass reaches top_p of theirs (0 or 1 = off; the zero default is off, so that an
     * initialiser that names neither keeps the full distribution). */
    int top_k;
    float top_p;
    uint64_t seed;               /* sampling seed */
    dfl_accept_rule accept_rule; /* temperature > 0: how drafts are accepted */
    int ignore_eos;
    /* At temperature 0, after an eos stop: write the target's greedy continuation past the eos,
     * up to `extend` tokens (and max_new in all), to out[generated..] (not streamed, not in the
     * statistics; st->extended says how many). Drafts accepted past an eos count as accepted, so
     * replay evaluation needs these tokens to score the last round exactly. */
    int extend;
    /* Optional: called after each verification round with the verified block [bs] at position
     * start, the drafter's output [bs-1, V] (its sampling probabilities with DFL_ACCEPT_PQ at
     * temperature > 0, top-k / top-p filtered when those are on; else its logits; NULL for a plain
     * decode step) and the accepted draft count. */
    void (*on_round)(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted);
    void *on_round_ud;
    /* 1: on_round reads no draft (it gets NULL), so a greedy chain may draft its argmaxes alone
     * (dfl_draft_if.draft_ids) */
    int on_round_no_draft;
    /* Optional (NULL: no cost): the target's raw logits row [V] (temperature 1, before any
     * sampling transform) that predicted a token. Called with prompt = 0 for each committed
     * output token i (out[i] = token), before the token callback sees it; with prompt_logits
     * set, also with prompt = 1 during the prefill for each prompt token i = 1..n_prompt-1 (the
     * row of position i-1; the prefill then computes every row's logits, a [chunk, V] buffer).
     * The committed tokens are the same with or without it. */
    void (*on_logits)(void *ud, int prompt, int i, int32_t token, const float *row, int V);
    void *on_logits_ud;
    int prompt_logits;
    /* Optional, greedy and without on_logits: for each committed output token i (out[i] = token,
     * before the token callback sees it) the on_top_k >= 1 most probable tokens of the row that
     * chose it, most probable first (ids[0] is the token), and their log-probabilities lp
     * [on_top_k]. The forwards return these summaries (dfl_fwd_out.top_k), not the rows. */
    void (*on_top)(void *ud, int i, int32_t token, const int32_t *ids, const float *lp);
    void *on_top_ud;
    int on_top_k;
} dfl_gen_opts;

typedef struct dfl_gen_stats {
    int prompt_tokens;
    int generated;                       /* tokens in the output */
    int rounds;                          /* verification rounds (speculative) or decode steps */
    long drafted;                        /* draft tokens proposed */
    long accepted;                       /* draft tokens accepted */
    long accept_hist[DFL_MAX_BLOCK + 1]; /* rounds with a accepted drafts, a = 0..B-1 */
    long pos_drafted[DFL_MAX_BLOCK];     /* rounds in which draft k (1-based) was proposed */
    long pos_accepted[DFL_MAX_BLOCK];    /* ... and accepted */
    int max_block;
    const char *stop;        /* "eos" or "max_new" */
    const char *accept_rule; /* "greedy" (temperature 0), "pq" or "match" */
    double t_prefill, t_decode, t_draft, t_verify, t_rollback;
    int ctx_check_failures; /* rounds where the drafter's context length != committed length */
    long tree_nodes;        /* DDTree: draft nodes verified over all rounds */
    long tree_depth_sum;    /* DDTree: sum over rounds of the tree's depth */
    int extended;           /* tokens written past the output (opts.extend) */
} dfl_gen_stats;

/* Called with each newly committed run of tokens (for streaming); nonzero return stops. */
typedef int (*dfl_token_cb)(void *ud, const int32_t *tokens, int n);

/* Generate from prompt. drafter NULL = autoregressive. out: [max_new] generated ids
 * (max_new 0: the prefill only, e.g. for the prompt's logits).
 * s must have max_batch >= max(prompt length, B) and record=1 when drafting (with a tree
 * budget N: max_batch >= N + 1 and target_state_enable_tree(s, N + 1));
 * the drafter's context must be empty (it is filled with the prompt's features). */
int spec_generate(dfl_target_state *s, dfl_draft_if *drafter, const int32_t *prompt, int n_prompt,
                  const dfl_gen_opts *o, int32_t *out, dfl_gen_stats *st, dfl_token_cb cb, void *ud);

/* Model eos test (config + generation_config + tokenizer_config ids). */
int spec_is_eos(const dfl_model *m, int32_t id);

/* Derived metrics, one definition per name everywhere dfl reports them (docs/design.md §7):
 * tau = (generated tokens - 1) / rounds, the tokens a verification round commits (the first
 * token comes from the prefill): generate's "tau", serve's "spec_accept_length", eval's
 * per-response "tau". tau_accept = 1 + accepted drafts / rounds (vLLM's mean acceptance length;
 * equal to tau unless eos or a length limit cut the last round short). */
double spec_tau(const dfl_gen_stats *st);
double spec_tau_accept(const dfl_gen_stats *st);

/* The members (no braces) of dfl generate --json's "stats" object to f: mode, token counts, stop,
 * timings and rates, memory, ISA; drafting: acceptance (tau, per position, histogram) and
 * committed[0..n_rounds), the tokens each round committed (accepted + 1). */
void spec_stats_json(FILE *f, const dfl_gen_stats *st, int drafting, int tree_budget, const int *committed,
                     int n_rounds, double t_load, uint64_t weight_bytes, uint64_t state_bytes, long max_ctx);

/* The sampling filter of top_k / top_p (0 = off for both; top_p 1 is off too) on a probability
 * vector p[V]: keeps the top_k most probable tokens, then of those the smallest set, most
 * probable first, whose mass reaches top_p of theirs (at least one token), as vLLM and HF
 * transformers apply them (top-k first; ties ranked by the lower id). Tokens outside get 0 and
 * the kept ones are renormalised to sum 1; with both off, p is left as it is. scratch: [V].
 * Returns the number of tokens kept (V when off). */
typedef struct dfl_ranked {
    float p;
    int32_t id;
} dfl_ranked;
int spec_sampling_filter(float *p, int V, int top_k, float top_p, dfl_ranked *scratch);

/* Small deterministic RNG (splitmix64 seeding xoshiro256**). */
typedef struct dfl_rng {
    uint64_t s[4];
} dfl_rng;
void rng_seed(dfl_rng *r, uint64_t seed);
double rng_uniform(dfl_rng *r); /* [0, 1) */

#endif
