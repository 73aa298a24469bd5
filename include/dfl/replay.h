/* Replay evaluation (docs/eval.md): at temperature 0 the target's greedy continuation of a
 * prompt and the hidden states of its tokens do not depend on the drafter or the verification
 * mode, so one recorded target pass scores every drafter x mode exactly with drafter-only work.
 *
 * record: a lossless speculative (or autoregressive) run captures the truth (the output, plus
 *         its greedy continuation past an eos) and the feature rows of every position;
 * replay: rounds run the drafter only; chain accepts the longest draft prefix equal to the
 *         truth, DDTree the deepest tree path equal to it; the bonus is the next truth token
 *         (round_walk / round_score, dfl/round.h: the online loop's scoring, the truth as the target).
 * Per-round accepted lengths equal the online runs' (tested token for token). */
#ifndef DFL_REPLAY_H
#define DFL_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "dfl/spec.h"

#define EVAL_MAX_FEAT_LAYERS 256

/* The truth of one prompt (or MT-Bench turn) and the features its drafters read. */
typedef struct eval_truth {
    int32_t *prompt; /* [n_prompt] prompt ids */
    int n_prompt;
    int32_t *ids; /* [n + n_ext] the output, then its greedy continuation past an eos */
    int n, n_ext;
    int eos_stop; /* the output ends with an eos (else it ran to max_new) */
    int H;        /* target hidden size */
    int n_layers; /* feature columns: decoder layer ids, ascending */
    int layers[EVAL_MAX_FEAT_LAYERS];
    float *feat;          /* [n_rows, n_layers*H]: row p = the layers' outputs at position p */
    int n_rows, cap_rows; /* rows held; replay needs n_prompt + n - 1 (every token but the last) */
} eval_truth;

/* An empty truth that will hold features of these layers (sorted, duplicates removed). */
int eval_truth_init(eval_truth *t, int H, const int *layers, int n_layers);
void eval_truth_free(eval_truth *t);
/* Append n feature rows (each [n_layers*H]). */
int eval_truth_add_rows(eval_truth *t, const float *rows, int n);
/* Set prompt and output (copies); n_ext tokens of ids past n are the continuation. Drops rows
 * beyond n_prompt + n - 1; fails naming what is missing if fewer rows are held. */
int eval_truth_set(eval_truth *t, const int32_t *prompt, int n_prompt, const int32_t *ids, int n, int n_ext,
                   int eos_stop);
/* Column of decoder layer k in the features, -1 if absent. */
int eval_truth_column(const eval_truth *t, int layer);

/* One draft as replay uses it: per draft position the argmax of the drafter's logits (chain)
 * and the K most probable tokens with their log-probabilities (DDTree, ddtree_topk). */
typedef struct eval_draft {
    int start, bs;   /* context length when drafted (= anchor position) and block size */
    int32_t *argmax; /* [bs-1] */
    int32_t *top;    /* [bs-1, K] (NULL when K == 0) */
    double *toplp;   /* [bs-1, K] */
} eval_draft;

/* Drafts of one drafter on one truth, shared by every mode (and filled by the recording run). */
typedef struct eval_draft_cache {
    eval_draft *d;
    int n, cap;
    int K; /* candidates kept per position: the largest tree budget (capped at V), 0 = chain only */
    int V;
    float *probs; /* scratch [max_block-1, V] */
    int max_block;
    /* the drafter's measured work over the whole run (kept by clear): context updates and drafts */
    double ctx_s, draft_s;
    long ctx_rows, drafts;
} eval_draft_cache;

int eval_draft_cache_init(eval_draft_cache *c, int K, int V, int max_block);
void eval_draft_cache_clear(eval_draft_cache *c);
void eval_draft_cache_free(eval_draft_cache *c);
/* Summarize drafter logits [bs-1, V] drafted at context length start into the cache. */
int eval_draft_cache_put(eval_draft_cache *c, int start, int bs, const float *logits);
/* The same, summarizing in place: the logits are overwritten (no copy into the cache's scratch). */
int eval_draft_cache_take(eval_draft_cache *c, int start, int bs, float *logits);
/* The same from a summarized draft (src->K >= the cache's K; its first K kept). */
int eval_draft_cache_put_top(eval_draft_cache *c, int start, int bs, const dfl_draft_top *src);
const eval_draft *eval_draft_cache_get(const eval_draft_cache *c, int start, int bs);

/* A drafter wrapped for recording: add_context appends the rows (over the truth's layers) to
 * the truth and passes the drafter's own columns on; draft() and draft_top() also summarize into
 * the cache (draft_top once for both: the loop's K and the cache's).
 * The wrapper's feature_layers are the truth's layers, so the target captures all of them. */
typedef struct eval_recorder {
    dfl_draft_if inner;
    eval_truth *truth;
    eval_draft_cache *cache;       /* may be NULL */
    int map[EVAL_MAX_FEAT_LAYERS]; /* inner layer i -> truth column */
    float *rows;                   /* scratch [chunk, inner layers * H] */
    int rows_cap;
    float *feat_in; /* [feat_cap, truth layers * H] rows read from a device */
    int feat_cap;
    float *lbuf;   /* draft_top: the inner drafter's logits [B-1, V] */
    int32_t *top;  /* draft_top: [B-1, K] the candidates for the loop and the cache */
    double *toplp; /* [B-1, K] */
    size_t lbuf_cap, top_cap;
    int V;
    int n_prompt;                          /* set by the caller: context updates below it are the prefill's */
    double overhead_s, overhead_prefill_s; /* time spent recording (not drafting), in rounds / in the prefill */
    /* adaptive (--record-mode auto; eval_recorder_adapt): each round speculates while the tokens
     * it commits per second of verification beat plain decode steps, and decodes otherwise, with
     * a speculative probe every EVAL_RECORD_PROBE decode steps. Tokens per round: a moving average
     * as the run goes; the two costs: the run's measured costs, else moving averages. */
    int adaptive;
    int fixed_costs; /* ema_verify_s and ema_decode_s come from eval_costs */
    int skipped;     /* the current round is a decode step */
    int n_spec, n_ar, since_probe;
    double t_round0, t_drafted; /* when the round began / its draft ended */
    double ema_verify_s, ema_tokens, ema_decode_s;
} eval_recorder;

#define EVAL_RECORD_PROBE 16

int eval_recorder_init(eval_recorder *r, dfl_draft_if inner, eval_truth *t, eval_draft_cache *cache, int V);
struct eval_costs;
/* Make the recording adaptive (before eval_recorder_if); costs (may be NULL or not ok): a decode
 * step's and a B-token chain verification's. */
void eval_recorder_adapt(eval_recorder *r, const struct eval_costs *costs, int B);
void eval_recorder_free(eval_recorder *r);
dfl_draft_if eval_recorder_if(eval_recorder *r);

/* Costs measured in this run for the modeled speedup: seconds of one target forward of n
 * tokens on top of a context (chain verification incl. its rollback; tree verification incl.
 * its commit). A budget whose cost could not be measured (its tree state does not fit) has
 * tree_s < 0. */
#define EVAL_MAX_COSTS 64
typedef struct eval_costs {
    int ok;
    int context; /* context length the costs were measured at */
    int reps;
    int n_chain;
    int chain_n[EVAL_MAX_COSTS]; /* tokens, ascending (1 = a decode step) */
    double chain_s[EVAL_MAX_COSTS];
    double chain_med[EVAL_MAX_COSTS]; /* the median of the timed repetitions (0: unknown) */
    int n_tree;
    int tree_budget[EVAL_MAX_COSTS];
    double tree_s[EVAL_MAX_COSTS];
    double tree_med[EVAL_MAX_COSTS];
    char note[256]; /* why some costs are missing */
} eval_costs;

/* Measure them on a context of the first prompt (up to 512 tokens): a decode step, a chain
 * verification of each block size (forward + rollback), a tree verification of each budget,
 * each forward as the greedy online loop runs it (argmax ids, the logits scratch)
 * (forward + commit) on a tree built from a real draft of dr (block blocks[0]; reset afterwards); after a warm-up,
 * the fastest of at least reps repetitions (more, up to 64, until 25 ms are timed). Budgets above DDTREE_MAX_BUDGET, or whose tree state does not fit, get no cost (note). */
int eval_costs_measure(eval_costs *c, const dfl_model *m, dfl_draft_if *dr, const int32_t *prompt, int n_prompt,
                       const int *blocks, int n_blocks, const int *budgets, int n_budgets, int reps);
/* The checks of a modeled speedup's costs (eval_costs_check): a verification of n >= 2 tokens, or
 * a tree, costs at least EVAL_COST_NOISE of a decode step (it computes more); the median of a
 * size's repetitions is at most EVAL_COST_SPREAD times its fastest (else the machine's load moved
 * them); the run's measured autoregressive step is between EVAL_COST_AR_LO and EVAL_COST_AR_HI
 * decode costs (it adds the loop's own work: up to ~3x on a tiny model). */
#define EVAL_COST_NOISE 0.8
#define EVAL_COST_SPREAD 2.0
#define EVAL_COST_AR_LO 0.67
#define EVAL_COST_AR_HI 4.0
/* 1 when the costs pass every check; else 0 and why (each failure, with the numbers) into why.
 * ar_step_s: the run's measured autoregressive decode time per token (<= 0: none measured). */
int eval_costs_check(const eval_costs *c, double ar_step_s, char *why, size_t n);

/* Seconds of a chain forward of n tokens (linear between measured sizes), of a tree of budget
 * N (-1 if not measured). */
double eval_cost_chain(const eval_costs *c, int n);
double eval_cost_tree(const eval_costs *c, int budget);

/* Per-mode result of a replay. */
typedef struct eval_replay_out {
    dfl_gen_stats st; /* as an online run would report them (times: see below) */
    int *round_acc;   /* [st.rounds] accepted drafts per round (malloc'd) */
    double draft_s;   /* drafter time this mode would spend (its rounds' share of the drafting, the context
                       * updates, the tree builds) */
    double modeled_s; /* draft_s + the verification costs of its rounds; < 0 without costs */
} eval_replay_out;

/* Replay one drafter on a truth in every mode (budgets[i] = 0: chain, N: DDTree-N) at once:
 * each distinct (position, block size) is drafted once. dft: a drafter with an empty context
 * (every drafter kind: DFlash, the MTP head); V: the vocabulary; layer_col: truth column of each
 * of the drafter's feature layers; B: block size; max_new: the run's. costs may be NULL. out[i]
 * is filled for each mode. */
int eval_replay(const eval_truth *t, dfl_draft_if *dft, int V, const int *layer_col, int B, int max_new,
                const int *budgets, int n_modes, eval_draft_cache *cache, const eval_costs *costs,
                eval_replay_out *out);
/* One truth of a batched replay: its truth, an empty context of the batch's drafter (each job its
 * own), its draft cache and its outputs [n_modes]. */
typedef struct eval_replay_job {
    const eval_truth *t;
    dfl_draft_if *dft;
    eval_draft_cache *cache;
    eval_replay_out *out;
} eval_replay_job;
/* eval_replay over nj truths in lockstep: each wave drafts the next block of every truth in one
 * forward where the drafter drafts across contexts (draft_across), so its weights stream once per
 * wave, not once per truth. Each job's outputs equal eval_replay's on its truth alone, bit for bit
 * (only the times differ: a forward's time is shared among its blocks). */
int eval_replay_many(const eval_replay_job *jobs, int nj, int V, const int *layer_col, int B, int max_new,
                     const int *budgets, int n_modes, const eval_costs *costs);
void eval_replay_out_free(eval_replay_out *o);
/* Extend drafter dr's context to `upto` positions of t (col: truth column of each of its feature
 * layers), chunk positions per call; rows [chunk, its layers * H] and toks [chunk] are scratch; c
 * (may be NULL) counts the rows and the time. */
int eval_replay_grow(dfl_draft_if *dr, const eval_truth *t, const int *col, float *rows, int32_t *toks, int chunk,
                     int upto, eval_draft_cache *c);

#endif
