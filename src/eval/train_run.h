/* --train-metrics in an evaluation run (src/eval/train_run.c): DIR/train.jsonl and its rows. */
#ifndef DFL_EVAL_TRAIN_RUN_H
#define DFL_EVAL_TRAIN_RUN_H

#include <stdio.h>

#include "dfl/train_metrics.h"

typedef struct tm_run {
    FILE *f;
    char *path;
    char **keys; /* the rows held (prompt, turn, drafter, labels, features, attention) */
    int n_keys, cap_keys;
    int num_anchors, blocks;
    uint64_t seed;
} tm_run;

/* DIR/train.jsonl, emptied, or kept with resume (a partial last line cut off). */
int tm_run_open(tm_run *tr, const char *dir, int resume);
void tm_run_close(tm_run *tr);
int tm_run_has(const tm_run *tr, const char *pid, int turn, const char *drafter, const char *labels,
               const char *features, const char *attn);

/* One response x drafter x label source x features x attention. */
typedef struct tm_job {
    const char *pid;
    int turn;
    const char *drafter, *labels, *features, *attn;
    const eval_truth *t;
    const tm_target *tt; /* NULL: no expected acceptance */
    dfl_draft_if *dif;   /* reset before and after */
    const int *col;
    int V, B;
} tm_job;
/* Score and append the row unless it is held. */
int tm_run_unit(tm_run *tr, const tm_job *j);

/* The rows of a train.jsonl summed per drafter x labels x features x attention (*out malloc'd;
 * none when the file does not exist). */
int tm_run_aggregate(const char *path, tm_agg **out, int *n_out);

#endif
