/* --train-metrics on a unit's truth: its own labels, the dataset's and the other template's
 * (teacher-forced through the target), --train-attn; the train.jsonl rows its plan lacks. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "eval/run.h"

/* Drafter d's train-metrics job on this truth, scored on these labels and features under attn. */
static tm_job unit_job(run *r, int d, const char *pid, int turn, const eval_truth *t, const tm_target *tt,
                       const char *labels, const char *features, const char *attn) {
    return (tm_job){.pid = pid,
                    .turn = turn,
                    .drafter = r->label[d],
                    .labels = labels,
                    .features = features,
                    .attn = attn,
                    .t = t,
                    .tt = tt,
                    .dif = &r->dif[d],
                    .col = r->col[d],
                    .V = r->m.cfg.vocab,
                    .B = r->block[d]};
}

/* --train-metrics on one truth: every drafter whose row the plan lacks (todo[d]) on these labels
 * and features (tt: the target's distribution along the truth, or NULL). */
int er_train_truth(run *r, const char *pid, int turn, const eval_truth *t, const char *labels, const char *features,
                   const tm_target *tt, const unsigned char *todo) {
    for (int d = 0; d < r->o->n_drafters; d++) {
        if (!todo[d]) continue;
        const tm_job j = unit_job(r, d, pid, turn, t, tt, labels, features, "config");
        if (tm_run_unit(&r->tm, &j)) return DFL_ERR;
    }
    return DFL_OK;
}

/* --train-attn: the truth's own labels scored again by each drafter with sliding layers under the
 * other block attention (the setting restored after). */
static int train_attn(run *r, const char *pid, int turn, const eval_truth *t, const tm_target *tt,
                      const unsigned char *todo) {
    const eval_opts *o = r->o;
    for (int d = 0; d < o->n_drafters && o->train_attn != EVAL_TRAIN_ATTN_NONE; d++) {
        dfl_any_drafter *a = &r->ad[d];
        if (!todo[d] || a->kind == DFL_DRAFTER_MTP || !drafter_has_sliding(&a->d)) continue;
        const tm_job j = unit_job(r, d, pid, turn, t, tt, "target", "dfl", drafter_causal_name(o->train_attn));
        int rc = anydrafter_set_causal(a, o->train_attn);
        if (rc == DFL_OK) rc = tm_run_unit(&r->tm, &j);
        const int back = anydrafter_set_causal(a, o->block_attn);
        if (rc || back) return DFL_ERR;
    }
    return DFL_OK;
}

/* prompt ids + labels teacher-forced through the target: a truth with the features of every
 * position (the last label needs none). */
static int teacher_truth(run *r, const int32_t *pids, int np, const int32_t *lab, int n, eval_truth *dt) {
    const int H = r->m.cfg.hidden;
    int32_t *seq = malloc((size_t)(np + n) * sizeof *seq);
    float *rows = malloc((size_t)r->batch * r->n_layers * H * sizeof *rows);
    int rc = seq && rows ? DFL_OK : dfl_seterr("out of memory");
    if (rc == DFL_OK && np + n > r->st.max_ctx)
        rc = dfl_seterr("%d prompt and %d label tokens exceed the context %d", np, n, r->st.max_ctx);
    if (rc == DFL_OK) {
        memcpy(seq, pids, (size_t)np * sizeof *seq);
        memcpy(seq + np, lab, (size_t)n * sizeof *seq);
        const dfl_capture cap = {.n_layers = r->n_layers, .layers = r->layers, .out = rows};
        target_state_reset(&r->st);
        for (int c0 = 0; c0 < np + n - 1 && rc == DFL_OK; c0 += r->batch) {
            const int c = np + n - 1 - c0 < r->batch ? np + n - 1 - c0 : r->batch;
            rc = model_forward(&r->st, seq + c0, c, NULL, 0, &cap);
            if (rc == DFL_OK) rc = eval_truth_add_rows(dt, rows, c);
        }
        target_state_reset(&r->st);
    }
    if (rc == DFL_OK) rc = eval_truth_set(dt, pids, np, lab, n, 0, 1);
    free(seq), free(rows);
    return rc;
}

/* The prompt's reference response as labels: the response, then <|im_end|> in a chat template
 * (the target's first eos without one), cut at --max-new. */
static int dataset_truth(run *r, const eval_prompt *p, const int32_t *pids, int np, eval_truth *dt) {
    const int chat = r->o->chat != DFL_CHAT_NONE;
    const size_t la = strlen(p->answer);
    char *txt = malloc(la + 16);
    if (!txt) return dfl_seterr("out of memory");
    int32_t *a = NULL;
    size_t na = 0;
    snprintf(txt, la + 16, "%s%s", p->answer, chat ? "<|im_end|>" : "");
    int rc = tok_encode(r->tok, txt, strlen(txt), &a, &na);
    if (rc == DFL_OK && !chat && r->m.n_eos > 0) {
        int32_t *b = realloc(a, (na + 1) * sizeof *a);
        if (!b) rc = dfl_seterr("out of memory");
        else a = b, a[na++] = r->m.eos_ids[0];
    }
    const int n = (int)na < r->max_new ? (int)na : r->max_new;
    if (rc == DFL_OK && n < 2) rc = dfl_seterr("its reference response has %d tokens: too short to score", n);
    if (rc == DFL_OK) rc = teacher_truth(r, pids, np, a, n, dt);
    free(txt), free(a);
    return rc;
}

/* Teacher-forced labels (labels: "dataset" or "template") scored by every drafter. */
static int train_teacher(run *r, const eval_prompt *p, const char *pid, int turn, const eval_truth *t,
                         const char *labels, const unsigned char *todo) {
    const eval_opts *o = r->o;
    eval_truth dt;
    tm_target dtt = {0};
    int32_t *ids = NULL;
    size_t ni = 0;
    int rc = eval_truth_init(&dt, r->m.cfg.hidden, r->layers, r->n_layers);
    if (rc == DFL_OK && labels[0] == 'd') {
        rc = dataset_truth(r, p, t->prompt, t->n_prompt, &dt);
    } else if (rc == DFL_OK) { /* the same response after the prompt in the other template */
        char *txt = er_turn_text(p, turn, "", (dfl_chat)o->train_chat);
        rc = txt ? tok_encode(r->tok, txt, strlen(txt), &ids, &ni) : dfl_seterr("out of memory");
        free(txt);
        if (rc == DFL_OK) rc = teacher_truth(r, ids, (int)ni, t->ids, t->n, &dt);
    }
    if (rc == DFL_OK && r->last_col >= 0) rc = tm_target_from_truth(&dtt, &dt, r->last_col, &r->m, o->train_topk);
    if (rc == DFL_OK) rc = er_train_truth(r, pid, turn, &dt, labels, "dfl", r->last_col >= 0 ? &dtt : NULL, todo);
    tm_target_free(&dtt);
    eval_truth_free(&dt);
    free(ids);
    if (rc)
        return dfl_preperr("prompt %s, training metrics on %s", pid,
                           labels[0] == 'd' ? "the dataset's reference response"
                                            : "the response in --train-chat's template");
    return DFL_OK;
}

/* --train-metrics for a truth: the teacher-forced label sets first (the dataset's reference
 * response, the response under --train-chat's template; turn 1 of a prompt, with a target), then
 * the truth's own, whose rows mark the unit complete. */
int er_train_unit(run *r, const eval_prompt *p, const char *pid, int turn, const turn_plan *tp, const eval_truth *t,
                  const tm_target *tt) {
    const eval_opts *o = r->o;
    const int teach = p && turn == 0 && r->have_state;
    for (int s = 0; s < 2 && teach; s++) {
        const char *labels = s == 0 ? "dataset" : "template";
        if ((s == 0 && !p->answer) || (s == 1 && o->train_chat < 0)) continue;
        const unsigned char *todo = tp->train[s == 0 ? TR_DATASET : TR_TEMPLATE];
        int any = 0;
        for (int d = 0; d < o->n_drafters; d++) any |= todo[d];
        if (any && train_teacher(r, p, pid, turn, t, labels, todo)) return DFL_ERR;
    }
    if (train_attn(r, pid, turn, t, tt, tp->train[TR_ATTN])) return DFL_ERR;
    return er_train_truth(r, pid, turn, t, "target", "dfl", tt, tp->train[TR_TARGET]);
}
