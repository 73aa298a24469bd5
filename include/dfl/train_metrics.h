/* Training-time metrics on a recorded trajectory (docs/train-vs-serve.md): the numbers drafter
 * training frameworks log, computed on the same sequence and features as the serving replay, so
 * that the gap between "training said 3.58" and "evaluation says 1.2" can be taken apart.
 *
 * A sequence is prompt + labels (the target's greedy output, or a dataset's reference response
 * teacher-forced through the target); the labels are the supervised (loss-mask) positions. An
 * anchor is a position p with p and p + 1 supervised (SpecForge's rule); its block is
 * [x_p, MASK x (B-1)] drafted on the context of the features at positions < p, and slot k
 * (1..B-1) predicts x_{p+k}, supervised while p + k is inside the sequence. Per anchor:
 *   correct_k        argmax of slot k equals x_{p+k} (SpecForge's accuracy pools these);
 *   leading run a    correct slots from k = 1 up to the first miss (simulated acceptance 1 + a);
 *   alpha_k          sum over the target's top-K tokens of min(p_draft, p_target) at slot k, a lower
 *                    bound of 1 - TV (DeepSpec's probabilistic acceptance), the target's distribution
 *                    taken from its last layer's hidden state at p + k - 1.
 * Anchor sets: every anchor, a seeded random subset of at most num_anchors (SpecForge's sampling),
 * and the serving walk's round starts (p, then p + a + 1, ...), whose mean 1 + a is the chain's
 * tau on these drafts. */
#ifndef DFL_TRAIN_METRICS_H
#define DFL_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "dfl/replay.h"

struct dfl_model;
struct cJSON;

/* Counts over a set of anchors, additive over responses; arrays are indexed by slot k (0 unused). */
typedef struct tm_counts {
    long anchors;
    long valid[DFL_MAX_BLOCK];   /* supervised slots */
    long correct[DFL_MAX_BLOCK]; /* ... whose argmax equals the label */
    long cont[DFL_MAX_BLOCK];    /* anchors whose leading run reached k - 1 and whose slot k is supervised */
    long reach[DFL_MAX_BLOCK];   /* anchors whose leading run reached k */
    double len_sum;              /* sum of 1 + leading run */
    /* expected acceptance at temperature 1 (exp_anchors 0: no target distribution) */
    long exp_anchors;
    double alpha[DFL_MAX_BLOCK]; /* sum of alpha_k over supervised slots (valid[k] of them) */
    double left[DFL_MAX_BLOCK];  /* sum of the target's mass outside its top-K there */
    double exp_len_sum;          /* sum of 1 + sum_k prod_{j<=k} alpha_j */
} tm_counts;

/* The target's distribution along a sequence: top-K of the softmax at positions first..first+n-1
 * (position q predicts the token at q + 1). */
typedef struct tm_target {
    int K, first, n;
    int32_t *ids; /* [n, K] */
    float *p;     /* [n, K] probabilities, descending */
    double *left; /* [n] 1 - their sum */
} tm_target;

/* From the truth's features of the target's last layer (column col): final norm, lm_head,
 * softmax, top K, for the positions that predict a label (n_prompt - 1 .. n_prompt + n - 2). */
int tm_target_from_truth(tm_target *tt, const eval_truth *t, int col, const struct dfl_model *m, int K);
void tm_target_free(tm_target *tt);

typedef struct tm_opts {
    int B;           /* block size */
    int num_anchors; /* the random subset's size cap per response (SpecForge's num_anchors, 512) */
    uint64_t seed;   /* the random subset's seed (mixed with the response's key) */
    int blocks;      /* at most this many blocks per drafter forward (0: as many as 64 MiB of logits
                      * hold, at most 32; drafters without draft_many: 1) */
} tm_opts;

/* One response's metrics. */
typedef struct tm_unit {
    int B;
    int n_valid; /* valid anchors */
    tm_counts rnd, all, walk;
    int *anchors, n_anchors; /* the random subset (positions, ascending) */
    double draft_s;          /* drafter seconds spent */
    long drafts;
} tm_unit;

/* Score drafter dft (empty context; reset by the caller) on the sequence t holds (prompt + labels
 * t->ids[0..n), features of every position but the last); col: truth column of each of the
 * drafter's feature layers; tt: the target's distribution (NULL: no expected acceptance); key:
 * mixed into the seed (the response's identity, so a resumed or re-ordered run draws the same
 * anchors). */
int tm_score(const eval_truth *t, dfl_draft_if *dft, const int *col, int V, const tm_target *tt, const tm_opts *o,
             uint64_t key, tm_unit *u);
void tm_unit_free(tm_unit *u);

/* 64-bit FNV-1a of a string, continued from h (start with TM_FNV_BASIS). */
#define TM_FNV_BASIS 0xcbf29ce484222325ULL
uint64_t tm_hash(uint64_t h, const char *s);

/* Derived figures of counts c (block B). */
double tm_accuracy(const tm_counts *c, int B);                        /* pooled: sum correct / sum valid */
double tm_accuracy_weighted(const tm_counts *c, int B, double gamma); /* w_k = exp(-(k-1)/gamma) */
double tm_sim_len(const tm_counts *c);                                /* mean of 1 + leading run */
double tm_naive_len(const tm_counts *c, int B); /* 1 + sum_k prod_{j<=k} acc_j from per-slot accuracy */
double tm_exp_len(const tm_counts *c);          /* mean expected acceptance length (T = 1); < 0: none */
/* SpecForge's default loss decay for a block size (7 for 16, 5 for 10, 4 for 8, else 7). */
double tm_default_gamma(int B);

/* One results line (train.jsonl, no newline) and its parse. */
typedef struct tm_row {
    char prompt_id[128], drafter[512];
    char labels[16];   /* "target" (greedy output) or "dataset" (reference response) */
    char features[16]; /* "dfl" or "pipeline" */
    char attn[24];     /* the drafter's block attention ("config" unless changed for a comparison) */
    int turn, B, prompt_tokens, tokens;
    tm_unit u;
} tm_row;
void tm_row_write(FILE *f, const tm_row *r);
int tm_row_parse(const char *line, tm_row *r);

/* Sum of rows of one drafter x labels x features x attention. */
typedef struct tm_agg {
    char drafter[512], labels[16], features[16], attn[24];
    int B, responses;
    tm_counts rnd, all, walk;
    double draft_s;
    long drafts;
} tm_agg;
void tm_counts_add(tm_counts *dst, const tm_counts *src);

/* The "Training vs serving" report (src/eval/train_report.c): per drafter the sets' figures, the
 * waterfall from the most training-like number to the serving replay's chain tau (one factor at
 * a time), the factor that moved it most, per-position rates and a plot. */
struct eval_summary;
typedef struct tm_report_in {
    const tm_agg *ag;
    int n;
    const struct eval_summary *s; /* the replay's aggregates (serving tau, per-position acceptance) */
    double gamma;
    int num_anchors, top_k;
    uint64_t seed;
    char exp_note[512];  /* why there is no expected acceptance, "" */
    char cost_note[512]; /* what the metrics cost next to the replay */
    char alt_chat[32];   /* --train-chat's template ("" for none) */
} tm_report_in;
void tm_report_json(const tm_report_in *in, FILE *f); /* a "train_vs_serve" member */
void tm_report_md(const tm_report_in *in, FILE *f);   /* the summary.md section */
int tm_report_svg(const tm_report_in *in, const char *path);

#endif
