/* Drafter evaluation (docs/design.md §7): prompt sets, per-response results, aggregates, reports. */
#ifndef DFL_EVAL_H
#define DFL_EVAL_H

#include <stdint.h>
#include <stdio.h>

#include "dfl/spec.h"

/* ---- prompt sets ----------------------------------------------------------------------- */

typedef enum eval_format {
    EVAL_FMT_GSM8K,    /* JSON lines with "question" */
    EVAL_FMT_MTBENCH,  /* JSON lines with "question_id" and "turns" (1 or 2 user turns) */
    EVAL_FMT_JSONL,    /* JSON lines, the prompt in a named string field */
    EVAL_FMT_TEXT,     /* one prompt per line */
    EVAL_FMT_MESSAGES, /* JSON lines with OpenAI "messages": [{"role", "content"}] */
    EVAL_FMT_SHAREGPT, /* JSON lines with ShareGPT "conversations": [{"from", "value"}] */
} eval_format;

typedef struct eval_prompt {
    char *id;       /* "idx" / "id" / "question_id" field, or the 1-based line number */
    char *turns[2]; /* user turns (MT-Bench may have two) */
    int n_turns;
    int line;     /* line in the file */
    char *answer; /* a reference response ("answer" or "response" field; messages / sharegpt: the
                   * assistant turn after the first user turn), NULL if none: the dataset labels of
                   * --train-metrics */
} eval_prompt;

typedef struct eval_prompts {
    eval_prompt *p;
    int n;
    int *bad_lines; /* lines skipped with keep_going */
    int n_bad;
} eval_prompts;

/* FNV-1a 64 of the user turns a run gives the target (the first only with first_turn), as 16 hex
 * digits: what tells two prompts of one id apart (run.json, eval-merge, eval-compare). */
void eval_prompt_hash(const eval_prompt *p, int first_turn, char out[24]);

/* Parse "gsm8k", "mtbench", "text", "messages", "sharegpt" or "jsonl:FIELD". */
int eval_format_parse(const char *s, eval_format *fmt, char *field, int field_len);
/* The format's name as --format takes it ("jsonl:FIELD" with its field) into out. */
void eval_format_name(eval_format fmt, const char *field, char *out, size_t n);
/* The format a prompt file's first line shows: "turns" -> mtbench, "messages" -> messages,
 * "conversations" -> sharegpt, else gsm8k (an unreadable file: gsm8k, its loading says why). */
eval_format eval_format_sniff(const char *path);
/* Load a prompt file. A malformed line is an error naming file and line, unless keep_going
 * (then it is recorded in bad_lines). limit > 0 keeps the first `limit` prompts. */
int eval_prompts_load(eval_prompts *ps, const char *path, eval_format fmt, const char *field, int limit,
                      int keep_going);
void eval_prompts_free(eval_prompts *ps);

/* ---- --protocol zlab: z-lab's dflash benchmark prompts (docs/eval.md) ----------------------- */

enum { EVAL_PROTOCOL_NONE = 0, EVAL_PROTOCOL_ZLAB = 1 };
enum { EVAL_ZLAB_GSM8K, EVAL_ZLAB_MATH500, EVAL_ZLAB_HUMANEVAL, EVAL_ZLAB_MBPP, EVAL_ZLAB_MTBENCH, EVAL_ZLAB_N };
#define EVAL_ZLAB_SEED 42      /* _select_dataset: random.Random(42).shuffle */
#define EVAL_ZLAB_MAX_NEW 2048 /* dflash cli.py --max-new-tokens default */

const char *eval_zlab_dataset_name(int d);  /* "gsm8k", "math500", "humaneval", "mbpp", "mt-bench" */
int eval_zlab_dataset_parse(const char *s); /* -1: unknown ("mtbench" is accepted too) */
/* The JSON members naming a dataset's prompt format ("field", and "suffix" or "template"). */
void eval_zlab_format_json(FILE *f, int d);
struct eval_opts;
/* Load o->prompts as the benchmark builds its prompts: the dataset (o->zlab_dataset, else from
 * --format, else from the first object's fields) formatted as DATASETS[name]["format"], then
 * random.Random(42).shuffle of the row order and the first o->limit rows (all when 0). */
int eval_zlab_load(eval_prompts *ps, const struct eval_opts *o, int *dataset);

/* ---- results and aggregates ------------------------------------------------------------- */

/* One response: the autoregressive run (mode "ar") or a drafter in a verification mode. Its scalar
 * fields are results.jsonl's columns: each has a row in src/eval/columns.c that says how it is
 * written, read back, aggregated into eval_agg and reported. */
typedef struct eval_result {
    char prompt_id[128];
    char drafter[512]; /* "" for the autoregressive run */
    char mode[32];     /* "ar", "chain" or "ddtree-N" */
    int turn;          /* 0 or 1 (MT-Bench second turn) */
    int rep;           /* repetition of a timed online run (--repeat): 0 is the first, the one the
                        * statistics use; rows of later repetitions only add speedups over runs */
    int act_bf16;      /* computed with bf16 activations (DFL_ACT=bf16, kn_act); 0: float32 */
    int device;        /* the dfl_device (dfl/backend.h) the target ran on (--device); 0: the CPU */
    int tokens;        /* generated tokens */
    int rounds;
    long drafted, accepted;
    int max_block;
    long accept_hist[DFL_MAX_BLOCK + 1];
    long pos_drafted[DFL_MAX_BLOCK], pos_accepted[DFL_MAX_BLOCK];
    long tree_depth_sum;
    double time_s; /* decode time (prefill excluded) */
    double prefill_s, draft_s, verify_s, rollback_s;
    int match;          /* speculative output equals the autoregressive one (1), differs (0), n/a (-1) */
    int first_mismatch; /* position of the first differing token, -1 */
    char method[16];    /* "online": the loop ran on the target; "replay": drafter-only on the recorded truth */
    char features[16];  /* "dfl", or "pipeline" (replayed on features from --features-from) */
    long tree_nodes;
    double modeled_s;     /* decode time modeled from costs measured in the run; < 0: none */
    double modeled_ar_s;  /* the autoregressive decode time of the same tokens, modeled alike; < 0: none */
    const int *round_acc; /* accepted drafts per round (written, not parsed back); NULL: none */
    int n_round_acc;
} eval_result;

/* A result with nothing set: method "online", features "dfl", no match, no modeled times,
 * float32 activations. */
void eval_result_init(eval_result *r);

/* Fill from generation stats. */
void eval_result_from_stats(eval_result *r, const dfl_gen_stats *st);
/* One JSON object (no newline); ids: the generated tokens (may be NULL). */
void eval_result_write(FILE *f, const eval_result *r, const int32_t *ids, int n_ids);
/* Parse one results.jsonl line; ids (optional) receives malloc'd token ids. */
int eval_result_parse(const char *line, eval_result *r, int32_t **ids, int *n_ids);
/* DFL_ERR naming `where` when r was computed in another activation mode than `bf16` (1: bf16
 * activations, 0: float32; the running process's kn_act). */
int eval_result_act_check(const eval_result *r, int bf16, const char *where);
/* DFL_ERR naming `where` when r's target ran on another device than `device` (dfl_device). */
int eval_result_device_check(const eval_result *r, int device, const char *where);

/* A results.jsonl as read back (--resume, eval-merge): its complete lines, parsed, in order. A
 * partial last line (no newline: an interrupted write, whatever its length) is left out and ends
 * the reading; good_end is then where the next line must go (the caller cuts the file there). */
typedef struct eval_results {
    eval_result *r;
    int32_t **ids; /* [n] output ids (NULL without want_ids, or when a line has none) */
    int *n_ids;
    int *line; /* [n] the line number of each */
    int n;
    long good_end; /* bytes of the complete lines (blank ones included) */
} eval_results;
/* Read f (named path in messages). act >= 0: every line must have been computed in that
 * activation mode (eval_result_act_check). A complete line that does not parse is an error
 * naming path:line; what was read before it stays in d. */
int eval_results_read(eval_results *d, FILE *f, const char *path, int want_ids, int act);
void eval_results_free(eval_results *d);

/* One response of an aggregate. */
typedef struct eval_resp {
    int line; /* the index of its result in what eval_summarize read */
    char prompt_id[128];
    int turn, tokens;
    double tau; /* (tokens - 1) / rounds (1 without rounds) */
    int capped; /* it reached the run's --max-new (eval_summary_outputs) */
    int loop;   /* the period of the loop it ends in (eval_output_loops); 0: none, or no ids */
} eval_resp;

/* Aggregate of all responses of one drafter x mode (or of the autoregressive runs). */
typedef struct eval_agg {
    char drafter[512], mode[32], method[16], features[16];
    char label[600]; /* the drafter as tables show it: "(online)" / "(pipeline features)" marked */
    int modeled;     /* responses with modeled times */
    double modeled_s, modeled_ar_s;
    long tree_nodes;
    int responses, tokens, rounds, mismatches, max_block;
    long drafted, accepted;
    double tau_sum; /* sum over responses of per-response tau */
    double time_s, ar_time_s;
    int ar_tokens;
    double draft_s, verify_s, rollback_s, prefill_s;
    long tree_depth_sum;
    long accept_hist[DFL_MAX_BLOCK + 1];
    long pos_drafted[DFL_MAX_BLOCK], pos_accepted[DFL_MAX_BLOCK];
    struct eval_resp *resp; /* each response of the first run, in the order read [responses] */
    double *speedups;       /* per-response measured speedup (online rows with the AR row of the same prompt/turn) */
    int n_speedups;
    double *speedups_modeled; /* per-response modeled speedup (rows with modeled times) */
    int n_speedups_modeled;
    double *run_speedups; /* per repetition (--repeat) of an online run: its measured speedup over all
                           * responses of that repetition; [n_run_speedups], index = rep */
    int n_run_speedups;
} eval_agg;

/* ---- statistics (docs/eval.md, "Statistics") ---------------------------------------------- */

#define EVAL_BOOT_RESAMPLES 2000
#define EVAL_BOOT_SEED 1
/* A drafter whose τ is at most this accepts (nearly) nothing: summary.md and stderr alarm. */
#define EVAL_TAU_DEAD 1.05
#define EVAL_DEAD_HINT                                                                                 \
    "check its target_layer_ids (the target layers it reads: dfl inspect DRAFTER --target T), its "    \
    "mask_token_id (the token its blocks are filled with in training), the target it was trained for " \
    "(hidden states of another checkpoint mean nothing to it) and its block attention (--block-attn)"

/* One prompt's τ in a row: the mean over its turns of per-response (tokens - 1) / rounds. */
typedef struct eval_ptau {
    const char *id; /* the prompt id (points into the results it came from) */
    double tau;
} eval_ptau;

/* The per-prompt τ of the row (drafter, mode, method, features) in res[0..n): the first response
 * of each prompt and turn of the first run (rep 0), sorted by id (strcmp). *out is malloc'd;
 * returns the count, -1 when out of memory. */
int eval_prompt_taus(const eval_result *res, int n, const char *drafter, const char *mode, const char *method,
                     const char *features, eval_ptau **out);

/* B - A over the prompts both have, paired by id: their mean τ, the mean of the per-prompt
 * differences and its 95% bootstrap interval [lo, hi] (eval_bootstrap_mean). */
typedef struct eval_paired {
    int n;
    double tau_a, tau_b, diff, lo, hi;
} eval_paired;
void eval_paired_compare(const eval_ptau *a, int na, const eval_ptau *b, int nb, int resamples, int64_t seed,
                         eval_paired *p);
/* The 95% percentile interval of the mean of d[0..n) over `resamples` resamples with replacement:
 * each draws n indices as Python's random.Random(seed).randrange(n) does, in turn; the 2.5th and
 * 97.5th percentiles of the resampled means (numpy's linear interpolation). n < 2: the mean twice. */
void eval_bootstrap_mean(const double *d, int n, int resamples, int64_t seed, double ci[2]);
/* The verdict in one line: "B accepts 0.42 ± 0.11 more tokens per round than A on these 80 prompts
 * (...)", or that the interval holds 0. */
void eval_paired_verdict(const eval_paired *p, const char *a, const char *b, char *out, size_t len);

/* A response loops when it ends in at least 3 copies of one span of p tokens (1 <= p <=
 * EVAL_LOOP_MAX_PERIOD) covering at least EVAL_LOOP_MIN_TOKENS tokens together. Returns the
 * smallest such p, 0 when it does not loop. */
#define EVAL_LOOP_MAX_PERIOD 256
#define EVAL_LOOP_MIN_TOKENS 32
int eval_output_loops(const int32_t *ids, int n);

/* Two rows of one mode compared (agg indices; a is the first drafter of that mode). */
typedef struct eval_cmp {
    int a, b;
    eval_paired p;
} eval_cmp;

typedef struct eval_summary {
    eval_agg *agg; /* agg[0] is the autoregressive baseline */
    int n_agg;
    int n_prompts; /* responses of the autoregressive run */
    int act_bf16;  /* the responses were computed with bf16 activations (DFL_ACT=bf16) */
    int device;    /* the dfl_device their target ran on (one per run: resume and merge check it) */
    eval_cmp *cmp; /* every other drafter against the first, per mode, method and features */
    int n_cmp;
    /* set by the caller for the reports (eval_summarize leaves them empty): */
    const struct cJSON *run;     /* what the run ran (run.json): summary.md's settings; NULL: unknown */
    int max_new;                 /* its --max-new (0: unknown); eval_summary_outputs flags what reached it */
    const char *modeled_warning; /* why the modeled speedups are unreliable (eval_costs_check); NULL: fine */
    int modeled_checked;         /* the costs were checked (eval_costs_check) */
    const char *warnings_md;     /* more warnings for the top of summary.md (markdown list items); NULL */
} eval_summary;

/* Build the summary from results (each response once; later duplicates are ignored), with the
 * paired comparisons of the drafters. */
int eval_summarize(eval_summary *s, const eval_result *results, int n);
/* Flag the responses that reached max_new (> 0) and those whose output loops (eval_output_loops;
 * ids[i] of results[i], or of any first-run row of the same prompt and turn that has them). */
void eval_summary_outputs(eval_summary *s, const eval_result *results, int32_t *const *ids, const int *n_ids, int n,
                          int max_new);
void eval_summary_free(eval_summary *s);
/* Derived figures of one aggregate. */
double eval_agg_tau(const eval_agg *a);             /* mean of per-response tau (z-lab's dataset tau) */
double eval_agg_tau_tokens(const eval_agg *a);      /* token-weighted: (tokens - responses) / rounds */
double eval_agg_speedup(const eval_agg *a);         /* AR time per token / this time per token (measured); 0: n/a */
double eval_agg_speedup_modeled(const eval_agg *a); /* the same from modeled times; 0: n/a */
/* The 10th, 50th and 90th percentiles of v[0..n) (linear interpolation between order statistics,
 * as numpy's default) into q[3]; 0 when n >= 2, -1 (no spread) otherwise. */
int eval_spread(const double *v, int n, double q[3]);

/* Reports into dir: summary.json (extra_json: a JSON object's members to merge in, or NULL),
 * summary.md (extra_md: sections to append, or NULL), per_position.svg, tau_hist.svg, and
 * tau_budget.svg when DDTree modes ran. */
int eval_write_reports(const eval_summary *s, const char *dir, const char *extra_json, const char *extra_md);
/* Remove the reports from dir (a run about to add results: they would no longer describe them). */
int eval_remove_reports(const char *dir);

/* ---- what a run ran: DIR/run.json (docs/eval.md) -------------------------------------------- */

/* run.json is written when a run starts (and kept up to date by --resume): its options and, per
 * prompt id, the hash of the prompt (eval_prompt_hash; null when unknown). eval-merge and --resume
 * compare runs by it; summary.json's run.prompt_set summarizes its prompts for eval-compare. */
#define EVAL_RUN_FORMAT "dfl-eval-run-1"
struct cJSON;
/* The first option in which runs a and b (run.json objects, or summary.json "run" objects of
 * older runs) differ, naming it and both values in msg; NULL when none does. Options absent from
 * either are not compared. */
const char *eval_run_differs(const struct cJSON *a, const struct cJSON *b, char *msg, size_t n);
/* The prompt set of a "prompts" object ({id: hash}): its size and a hash over the sorted ids and
 * their hashes ("" when a prompt's hash is unknown) into hash, and over the ids alone into ids. */
int eval_prompt_set(const struct cJSON *prompts, char hash[24], char ids[24]);

/* ---- the evaluation run ------------------------------------------------------------------ */

#define EVAL_MAX_DRAFTERS 8
#define EVAL_MAX_REPLAY_BATCH 64 /* --replay-batch */
#define EVAL_MAX_MODES 16
#define EVAL_RECORD_AUTO (-2)
#define EVAL_MAX_REPEAT 100
#define EVAL_TRAIN_ATTN_NONE (-9)

typedef struct eval_progress {
    int done, total;  /* prompts */
    const char *what; /* the prompt just finished */
    double last_tau;
} eval_progress;

/* A run spread over processes (dfl eval under MPI: src/cli/eval_mpi.c, docs/eval.md). A unit is
 * a prompt (both turns) or, with --features, a saved truth. One process, the writer, keeps
 * results.jsonl and the reports; every process runs the units next hands it. */
typedef struct eval_dist {
    int writer; /* this process writes results.jsonl and the reports (MPI rank 0) */
    void *ud;
    /* writer only, once before any unit: the n units in run order, their names, weights (prompt
     * tokens plus --max-new per turn), whether results.jsonl holds all of their lines already, and
     * the lines it holds for each (JSON lines, "" for none) */
    int (*plan)(void *ud, int n, char *const *names, const long *weight, const int *complete, char *const *done);
    /* the next unit to run (-1: none left) and the results lines already held for it (malloc'd,
     * NULL when none): a process elsewhere skips them as a resumed run does */
    int (*next)(void *ud, int *unit, char **done);
    /* a finished results.jsonl line (no newline): written by the writer, or sent to it */
    int (*emit)(void *ud, const char *line);
    /* writer only, after its last unit: waits for the others. DFL_ERR with a message naming
     * the units that are missing (a process that died or failed) */
    int (*finish)(void *ud);
} eval_dist;

typedef struct eval_opts {
    int protocol;             /* EVAL_PROTOCOL_ZLAB: z-lab's prompts, selection and template */
    int zlab_dataset;         /* EVAL_ZLAB_*; -1: from --format or the fields */
    const char *dump_prompts; /* write each prompt (per turn) as JSON lines: text and token ids */
    const char *dump_answer;  /* prompts only (no drafters): the first answer second turns are built on */
    const char *target;       /* target checkpoint (with features_dir: optional, default the recorded one) */
    const char *drafters[EVAL_MAX_DRAFTERS];
    int n_drafters;
    const char *prompts;   /* prompt file (not with features_dir) */
    const char *tokenizer; /* tokenizer.json or a directory holding one; NULL = the target's */
    eval_format fmt;
    char field[128];
    int have_fmt, limit, max_new, chat, block, first_turn, resume, shard_i, shard_n, keep_going, max_ctx;
    int max_new_set;                      /* max_new was given (with features_dir it must equal the recorded one) */
    int budgets[EVAL_MAX_MODES], n_modes; /* 0 = chain, N = DDTree-N */
    double temperature;
    int top_k;    /* sampling filters at temperature > 0 (online): 0 = off */
    double top_p; /* 0 or 1 = off */
    long seed;
    int accept_rule; /* dfl_accept_rule: at temperature > 0 (online) */
    const char *out;
    const char *reference, *reference_url;
    /* online: every drafter x mode runs the speculative loop on the target after an autoregressive
     * run (measured speedups). Otherwise replay: one recording run per prompt, every drafter x mode
     * replayed on it (modeled speedups). */
    int online;
    int repeat;                /* online: run the autoregressive and every speculative run of each prompt this
                                * many times (rows with rep 0..repeat-1): speedups with their spread over runs */
    int check_ar;              /* replay: also run the target autoregressively, check the truth token for token */
    int record_budget;         /* replay: the recording run's mode (drafter 1); -1 = the first mode,
                                * EVAL_RECORD_AUTO = chain rounds or decode steps, whichever is cheaper */
    const char *save_features; /* replay: write each truth and its features to this directory */
    const int *save_layers;    /* ... also these layers (NULL: only the drafters'); n_save_layers -1 = all */
    int n_save_layers;
    const char *features_dir;  /* replay from saved features: no target forward */
    const char *features_from; /* also replay on features written by another pipeline (hidden-diff format) */
    int cost_reps;             /* repetitions of each cost measurement (0 = no modeled speedup) */
    int replay_batch;          /* replay: truths replayed together, each drafter forward drafting a block
                                * of each (the drafter's weights stream once for all); 1: one at a time */
    /* --train-metrics (replay; docs/train-vs-serve.md): the training frameworks' metrics on each
     * truth (train.jsonl) and the "Training vs serving" report */
    int train_metrics;
    int train_anchors;     /* random anchors per response (SpecForge's num_anchors, default 512) */
    double train_gamma;    /* loss decay of the weighted accuracy (0: by block size) */
    int train_topk;        /* the target's top-K kept for the expected acceptance (default 64) */
    int train_batch;       /* at most this many anchors' blocks per drafter forward (0: automatic) */
    int train_chat;        /* also score each response after its prompt in this template (dfl_chat), -1 */
    int train_attn;        /* also score with this block attention (drafter_set_causal value) the
                            * drafters with sliding_attention layers, or EVAL_TRAIN_ATTN_NONE */
    int block_attn;        /* the drafters' block attention (drafter_set_causal value; default
                            * DFL_BLOCK_ATTN_AUTO: each checkpoint's config) */
    int device;            /* dfl_device (dfl/backend.h) the target's forwards run on (--device; the
                            * drafters stay on the CPU); not with features_dir (no target forward) */
    const eval_dist *dist; /* spread over processes (NULL: this process runs every unit) */
    FILE *log;             /* warnings and per-run lines (NULL: quiet) */
    void (*on_progress)(void *ud, const eval_progress *p);
    void *progress_ud;
} eval_opts;

/* Defaults: max_new 256, chatml, chain only, shard 0/1, replay, cost_reps 3, repeat 1, replay_batch 8. */
void eval_opts_default(eval_opts *o);
/* After parsing, with o->protocol set: z-lab's template (thinking off) unless a chat mode was
 * given (chat_set), --max-new 2048 unless given. */
void eval_opts_protocol_defaults(eval_opts *o, int chat_set);
/* A recording mode: "chain", "ddtree-N" (or a bare N) or "auto" (EVAL_RECORD_AUTO) into *budget. */
int eval_record_mode_parse(const char *s, int *budget);
/* The options' consistency (modes, budgets, replay vs online); eval_run checks it too. */
int eval_opts_check(const eval_opts *o);

typedef struct eval_outcome {
    int mismatches; /* speculative outputs (online) or truths (--check-ar) that differ */
    int responses;  /* results written by this run */
} eval_outcome;

/* Run an evaluation into o->out (results.jsonl, summary.json, summary.md, plots; docs/eval.md).
 * Every input is checked before any target work. DFL_ERR with the message on failure; mismatches
 * are not errors (the caller decides the exit status). */
int eval_run(const eval_opts *o, eval_outcome *res);
/* Only build the prompts and write them to o->dump_prompts (no target, no drafters): the
 * tokenizer is o->tokenizer or o->target's; second turns only with o->dump_answer. */
int eval_dump_prompts(const eval_opts *o);

#endif
