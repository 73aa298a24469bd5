/* dfl eval's run (eval_run, include/dfl/eval.h) as its files share it: run.c opens, plans, runs
 * and closes; plan.c says up front which rows results.jsonl lacks; unit_online.c, unit_replay.c
 * and unit_train.c compute the rows of one unit; manifest.c and truth.c keep saved features;
 * run_setup.c, run_json.c, run_summary.c and turns.c do the rest. */
#ifndef DFL_EVAL_RUN_H
#define DFL_EVAL_RUN_H

#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "dfl/any_drafter.h"
#include "dfl/eval.h"
#include "dfl/prompt.h"
#include "dfl/reference.h"
#include "dfl/replay.h"
#include "eval/features.h"
#include "eval/train_run.h"

/* ---- saved features: a manifest line (manifest.c) ------------------------------------------ */

typedef struct mf_entry {
    int index, turn, prompt_tokens, tokens;
    char prompt_id[128];
    char file[64];
    char prompt_hash[24]; /* of the prompt's user turns (eval_prompt_hash); "" in older manifests */
} mf_entry;

typedef struct mf_list {
    mf_entry *u;
    int n;
} mf_list;

/* ---- the plan: what each unit still lacks (plan.c) ----------------------------------------- */

/* train.jsonl rows of a turn, each per drafter: the truth's own labels, the dataset's reference
 * response, the response under --train-chat's template, --train-attn, the pipeline's features */
enum { TR_TARGET, TR_DATASET, TR_TEMPLATE, TR_ATTN, TR_PIPELINE, TR_KINDS };

/* The rows one turn of a unit must still write; a bit per mode in the masks. */
typedef struct turn_plan {
    int complete;  /* every row that marks the turn done is there: nothing runs */
    int truth_row; /* the row of results whose output ids are the turn's truth when it is not run, -1 */
    int saved;     /* replay with --save-features resumed: the truth saved for it (in r->saved), -1 */
    int rec, ar;   /* replay: the recording run's row, the --check-ar autoregressive row */
    uint16_t replay[2][EVAL_MAX_DRAFTERS]; /* replay rows on dfl's features, on the pipeline's */
    unsigned char train[TR_KINDS][EVAL_MAX_DRAFTERS];
    unsigned char *ar_rep; /* online: [repeat] the autoregressive row */
    uint16_t *spec;        /* online: [repeat * EVAL_MAX_DRAFTERS] */
} turn_plan;

/* A unit of this process: a prompt (every turn) or a saved truth (--features). */
typedef struct work {
    int item;    /* index in r->ps.p, or in r->saved.u */
    long weight; /* prompt tokens plus --max-new per turn (MPI hands out the heaviest first) */
    int n_turns; /* planned turns (a saved truth: its one turn in turn[0]) */
    turn_plan turn[2];
} work;

/* A truth whose replay on dfl's features waits for the others of its batch (--replay-batch). */
typedef struct pend_replay {
    char *pid;
    int turn;
    eval_truth t;
    uint16_t todo[EVAL_MAX_DRAFTERS]; /* replay rows to write: a bit per mode, per drafter */
    int own_cache0;                   /* cache0 holds the recording's drafts of drafter 0 */
    eval_draft_cache cache0;
} pend_replay;

/* ---- the run ------------------------------------------------------------------------------ */

typedef struct run {
    const eval_opts *o;
    eval_prompts ps;
    int32_t **ids0; /* [ps.n] the first turn of each prompt, tokenized once */
    int *n_ids0;
    dfl_model m;
    int have_model;
    dfl_any_drafter ad[EVAL_MAX_DRAFTERS]; /* DFlash, DFlash2 or an MTP head, and its run state */
    dfl_draft_if dif[EVAL_MAX_DRAFTERS];   /* each drafter as the loops drive it (er_alloc_states) */
    char *label[EVAL_MAX_DRAFTERS];        /* its name in results and summaries: the --drafter argument, or
                                            * "mtp (DIR)" for the MTP head of checkpoint DIR */
    eval_draft_cache cache[EVAL_MAX_DRAFTERS];
    int n_open, n_dstate, n_cache;
    int block[EVAL_MAX_DRAFTERS];
    int col[EVAL_MAX_DRAFTERS][EVAL_MAX_FEAT_LAYERS]; /* drafter's layer i -> truth column */
    int layers[EVAL_MAX_FEAT_LAYERS], n_layers;       /* the truth's feature layers */
    dfl_tokenizer *tok;
    ref_set refs;
    eval_results done; /* results.jsonl's complete lines (and those handed over with a unit) */
    work *plan;        /* this process's units, in run order */
    int n_plan;
    int max_prompt; /* positions of the longest unit's prompts (a second turn adds an answer) */
    FILE *resf, *reff, *manf, *dumpf;
    int writes;       /* writes --out (not a worker of a spread run) */
    int zlab_dataset; /* with --protocol zlab: the dataset (EVAL_ZLAB_*) */
    char *res_path, *ref_path;
    int lock_fd, feat_lock_fd; /* flocks of --out and of --save-features */
    char *feat_incomplete;     /* --features: the recording that saved them did not finish (message) */
    char recorder[256];        /* what produced the truths: "dfl", or --features' target.json "recorder"
                                * (the Python package's transformers recorder) */
    cJSON *desc;               /* DIR/run.json as this run wrote it (writer only) */
    dfl_target_state st;
    int have_state;
    eval_costs costs;
    eval_target_id id;
    mf_list saved; /* the save_features manifest (resume) or the features_dir one */
    int max_new, max_block, max_budget, rec_budget;
    int rec_auto; /* --record-mode auto */
    int replay;   /* replay (1) or online (0) */
    int from_features;
    int device; /* where the target ran (o->device, or the saved truths' device with features_dir) */
    eval_outcome res;
    int ref_compared, ref_agree;
    /* per-round accepted lengths of an online run (er_on_round) */
    int *acc, n_acc, cap_acc;
    tm_run tm;         /* --train-metrics: train.jsonl */
    FILE *fcf;         /* --features-from: features_check.jsonl */
    int last_optional; /* the target's last layer when held only for --train-metrics (a pipeline may lack it), -1 */
    int last_col;      /* truth column of the target's last layer (the target's distribution), -1 */
    int batch;         /* tokens per target forward */
    char *warn_md;     /* warnings for the top of summary.md (mask tokens), NULL when none */
    /* batched replay: the truths waiting, and per drafter the contexts of batch slots 1.. (DFlash
     * drafters; slot 0 is dif[d]) and each slot's draft cache */
    pend_replay *pend;
    int n_pend, replay_batch;
    dfl_drafter_state *xst[EVAL_MAX_DRAFTERS]; /* [replay_batch - 1], NULL: one truth at a time */
    dfl_draft_if *xdif[EVAL_MAX_DRAFTERS];
    int n_xst[EVAL_MAX_DRAFTERS];
    eval_draft_cache *bcache; /* [replay_batch] */
    int n_bcache;
} run;

/* The buffers a unit runs in: the truth, an output, and the sizes they were made for. */
typedef struct unit_bufs {
    eval_truth t;
    int32_t *truth, *out; /* [max_new + max_block] */
    int max_ctx, tree_slots;
} unit_bufs;

/* run.c: rows, messages */
void er_log(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void er_mode_name(int budget, char *buf, size_t n);
const char *er_rec_row(const run *r, char *mode, size_t n);
void er_on_round(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted);
void er_result_head(eval_result *e, const char *pid, int turn, const char *drafter, const char *mode,
                    const char *method, const char *features);
int er_write_result(run *r, eval_result *e, const int32_t *ids, int n_ids);
int er_check_reference(run *r, const char *pid, int turn, const int32_t *prompt, int np, const int32_t *truth, int n);

/* plan.c */
int er_done_load(eval_results *d, const char *path, int device);
int er_done_add_text(eval_results *d, const char *text, int device);
int er_plan_unit(const run *r, work *w);
void er_plan_free(run *r);
int er_plan_complete(const run *r);
int er_plan_dist(run *r);
int er_truth_ids(const run *r, const turn_plan *tp, const char *pid, int turn, int32_t *truth, int *n);

/* turns.c */
char *er_turn_text(const eval_prompt *p, int turn, const char *answer1, dfl_chat chat);
int er_load_prompts(eval_prompts *ps, const eval_opts *o, int *zlab_dataset);
int er_dump_prompt(FILE *f, const char *path, int index, const eval_prompt *p, int turn, const char *answer1,
                   const char *text, const int32_t *ids, size_t n);

/* manifest.c */
int er_manifest_load(mf_list *l, const char *dir, int must_exist);
int er_manifest_find(const mf_list *l, int index, int turn);
int er_manifest_append(run *r, int index, int turn, const char *name, const eval_truth *t);
int er_saved_layer(const char *dir, int k);
void er_costs_json(FILE *x, const eval_costs *c);
int er_costs_load(eval_costs *c, const char *dir);
int er_target_json(run *r, int complete);
int er_features_complete(run *r, const char *dir);

/* truth.c */
int er_truth_save(run *r, const char *pid, int turn, int index, const eval_truth *t);
int er_truth_load(run *r, const char *dir, const mf_entry *u, eval_truth *t);

/* unit_online.c, unit_replay.c, unit_train.c: the rows of one unit its plan lacks */
int er_unit_online(run *r, const char *pid, int turn, const turn_plan *tp, const int32_t *pids, int np, int32_t *truth,
                   int *n_truth, int32_t *out, double *last_tau);
int er_unit_replay(run *r, const eval_prompt *p, int index, int turn, const turn_plan *tp, const int32_t *pids, int np,
                   unit_bufs *b, int *n_truth, double *last_tau);
int er_unit_saved(run *r, const work *w, unit_bufs *b, double *last_tau);
/* Replay the waiting truths (every drafter, each in one batch) and write their rows. */
int er_replay_flush(run *r);
void er_replay_free(run *r);
int er_train_truth(run *r, const char *pid, int turn, const eval_truth *t, const char *labels, const char *features,
                   const tm_target *tt, const unsigned char *todo);
int er_train_unit(run *r, const eval_prompt *p, const char *pid, int turn, const turn_plan *tp, const eval_truth *t,
                  const tm_target *tt);

/* run_setup.c */
int er_mkdir_p(const char *dir);
int er_lock_dir(const char *dir, const char *what, int *fd);
int er_check_mask_tokens(run *r);
int er_open_drafters(run *r);
int er_alloc_states(run *r, int max_ctx, int batch);
int er_alloc_replay_batch(run *r, int max_ctx);

/* run_json.c, run_summary.c */
const char *er_chat_name(int chat);
int er_write_run_json(run *r);
int er_write_summary(run *r, const char *missing);

#endif
