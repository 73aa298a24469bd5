/* dfl eval's orchestration (eval_run, include/dfl/eval.h): open, plan, run the plan, close. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "dfl/prompt.h"
#include "eval/run.h"

/* A mode's name in results: "chain" or "ddtree-N". */
void er_mode_name(int budget, char *buf, size_t n) {
    if (budget) snprintf(buf, n, "ddtree-%d", budget);
    else snprintf(buf, n, "chain");
}

/* The line of a unit's recording run: drafter 1's online run in the recording mode; with
 * --record-mode auto (decode steps mixed in: no online run of any mode) mode "auto", method
 * "record", which summaries leave out. */
const char *er_rec_row(const run *r, char *mode, size_t n) {
    if (r->rec_auto) return snprintf(mode, n, "auto"), "record";
    er_mode_name(r->rec_budget, mode, n);
    return "online";
}

void er_log(const run *r, const char *fmt, ...) {
    if (!r->o->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->o->log, fmt, ap);
    va_end(ap);
}

void er_on_round(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted) {
    (void)start, (void)block, (void)bs, (void)draft, (void)V;
    run *r = ud;
    if (r->n_acc == r->cap_acc) {
        r->cap_acc = r->cap_acc ? 2 * r->cap_acc : 256;
        r->acc = realloc(r->acc, (size_t)r->cap_acc * sizeof *r->acc);
    }
    r->acc[r->n_acc++] = accepted;
}

int er_write_result(run *r, eval_result *e, const int32_t *ids, int n_ids) {
    const eval_dist *dd = r->o->dist;
    e->device = r->device;
    if (dd) { /* the writer's file, or a message to it */
        char *line = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&line, &len);
        if (!m) return dfl_seterr("out of memory");
        eval_result_write(m, e, ids, n_ids);
        fclose(m);
        const int rc = dd->emit(dd->ud, line);
        free(line);
        if (rc) return rc;
    } else {
        eval_result_write(r->resf, e, ids, n_ids);
        fputc('\n', r->resf);
        if (fflush(r->resf) != 0 || ferror(r->resf))
            return dfl_seterr("%s: write error: %s", r->res_path, strerror(errno));
    }
    r->res.responses++;
    return DFL_OK;
}

void er_result_head(eval_result *e, const char *pid, int turn, const char *drafter, const char *mode,
                    const char *method, const char *features) {
    eval_result_init(e);
    e->act_bf16 = kn_act_get() == KN_ACT_BF16;
    e->turn = turn;
    snprintf(e->prompt_id, sizeof e->prompt_id, "%s", pid);
    snprintf(e->drafter, sizeof e->drafter, "%s", drafter);
    snprintf(e->mode, sizeof e->mode, "%s", mode);
    snprintf(e->method, sizeof e->method, "%s", method);
    snprintf(e->features, sizeof e->features, "%s", features);
}

/* The reference agreement of a truth. */
int er_check_reference(run *r, const char *pid, int turn, const int32_t *prompt, int np, const int32_t *truth, int n) {
    const eval_opts *o = r->o;
    if (!o->reference && !o->reference_url) return DFL_OK;
    const ref_entry *re = o->reference ? ref_find(&r->refs, pid, turn) : NULL;
    int32_t *rids = NULL;
    int nr = 0, have = 0;
    if (re) rids = re->ids, nr = re->n, have = 1;
    else if (o->reference_url) {
        if (ref_url_generate(o->reference_url, prompt, np, r->max_new, &rids, &nr) != DFL_OK)
            return dfl_preperr("prompt %s: reference", pid);
        have = 1;
    }
    if (have) {
        const int div = ref_first_divergence(truth, n, rids, nr);
        fprintf(r->reff, "{\"prompt_id\": ");
        dfl_json_write_string(r->reff, pid);
        fprintf(r->reff, ", \"turn\": %d, \"dfl_tokens\": %d, \"reference_tokens\": %d, \"first_divergence\": %d}\n",
                turn, n, nr, div);
        fflush(r->reff);
        r->ref_compared++;
        r->ref_agree += div < 0;
        if (div >= 0)
            er_log(r, "[dfl eval] prompt %s turn %d: target output diverges from the reference at token %d\n", pid,
                   turn + 1, div);
    } else {
        er_log(r, "dfl eval: prompt %s turn %d: no reference entry\n", pid, turn + 1);
    }
    if (!re) free(rids);
    return DFL_OK;
}

static void run_free(run *r) {
    tm_run_close(&r->tm);
    if (r->fcf) fclose(r->fcf);
    if (r->resf) fclose(r->resf);
    if (r->reff) fclose(r->reff);
    if (r->manf) fclose(r->manf);
    if (r->dumpf) fclose(r->dumpf);
    free(r->res_path), free(r->ref_path), free(r->acc), free(r->saved.u);
    er_plan_free(r);
    eval_results_free(&r->done);
    ref_set_free(&r->refs);
    if (r->tok) tok_close(r->tok);
    er_replay_free(r);
    for (int d = 0; d < r->n_cache; d++) eval_draft_cache_free(&r->cache[d]);
    if (r->have_state) target_state_free(&r->st);
    for (int d = 0; d < EVAL_MAX_DRAFTERS; d++) free(r->label[d]);
    for (int d = 0; d < r->n_open; d++) anydrafter_close(&r->ad[d]);
    if (r->have_model) model_close(&r->m);
    if (r->lock_fd > 0) close(r->lock_fd);
    if (r->feat_lock_fd > 0) close(r->feat_lock_fd);
    free(r->feat_incomplete), free(r->warn_md);
    cJSON_Delete(r->desc);
    for (int i = 0; r->ids0 && i < r->ps.n; i++) free(r->ids0[i]);
    free(r->ids0), free(r->n_ids0);
    eval_prompts_free(&r->ps);
}

/* ---- open: every input checked and every output opened before any work -------------------- */

/* --features: the saved truths' manifest, and what their first file says of the recording (its
 * target, --max-new, device). */
static int open_features(run *r, char *target, size_t n) {
    const eval_opts *o = r->o;
    int rc = er_manifest_load(&r->saved, o->features_dir, 1);
    if (rc == DFL_OK && r->saved.n == 0) rc = dfl_seterr("%s/manifest.jsonl lists no saved truths", o->features_dir);
    if (rc == DFL_OK) rc = er_features_complete(r, o->features_dir);
    if (rc) return rc;
    if (r->feat_incomplete) er_log(r, "dfl eval: warning: %s\n", r->feat_incomplete);
    char *p0 = dfl_path_join(o->features_dir, r->saved.u[0].file);
    st_checkpoint st = {0};
    if ((rc = st_open_file(&st, p0)) == DFL_OK) {
        rc = st_meta_get(&st, 0, "target", target, n);
        char mx[32];
        if (rc == DFL_OK && st_meta_get(&st, 0, "max_new", mx, sizeof mx) == DFL_OK) {
            char *end;
            const long v = strtol(mx, &end, 10);
            if (end == mx || *end || v < 1 || v > 1 << 24)
                rc =
                    dfl_seterr("%s: __metadata__ max_new: expected an integer in [1, %d], found '%s'", p0, 1 << 24, mx);
            r->max_new = (int)v;
        }
        /* the device the truths were recorded on (absent: the CPU): the results are marked with it */
        if (rc == DFL_OK && st_meta_get(&st, 0, "device", mx, sizeof mx) == DFL_OK &&
            (r->device = eval_device_lookup(mx)) < 0)
            rc = dfl_seterr("%s: __metadata__ device: expected cpu or cuda, found '%s'", p0, mx);
        if (rc == DFL_OK && o->max_new_set && o->max_new != r->max_new)
            rc = dfl_seterr("%s: recorded with --max-new %d; a replay cannot give another --max-new (%d)", p0,
                            r->max_new, o->max_new);
        st_close(&st);
    }
    free(p0);
    return rc;
}

/* The target, the drafters, the tokenizer and the reference file. */
static int open_target(run *r, const char *target) {
    const eval_opts *o = r->o;
    /* a replay on saved features runs only the target's embedding and lm_head */
    int rc = model_open(&r->m, target,
                        r->from_features              ? DFL_OPEN_HEAD_ONLY
                        : o->device != DFL_DEVICE_CPU ? DFL_OPEN_FOR_DEVICE
                                                      : 0);
    if (rc) {
        if (r->from_features && !o->target)
            dfl_preperr("the target the features were recorded on (give --target for its embedding and lm_head)");
        return rc;
    }
    r->have_model = 1;
    /* --device: can it run here (no usable GPU: said now); the weights go there after the checks */
    if (!r->from_features && (rc = dfl_device_check((dfl_device)o->device))) return rc;
    if ((rc = eval_target_identity(&r->m, &r->id)) || (rc = er_open_drafters(r))) return rc;
    if (!r->from_features || o->reference) {
        if (tok_locate(o->tokenizer, target, r->from_features ? "--reference needs" : "the prompts need") ||
            !(r->tok = tok_open(o->tokenizer ? o->tokenizer : target)))
            return DFL_ERR;
    }
    if ((rc = er_check_mask_tokens(r))) return rc;
    return o->reference ? ref_file_load(&r->refs, o->reference, r->tok) : DFL_OK;
}

/* --save-features DIR: locked, its manifest read (a resumed recording keeps its saved truths). */
static int open_save_features(run *r) {
    const eval_opts *o = r->o;
    int rc = er_mkdir_p(o->save_features);
    if (rc == DFL_OK) rc = er_lock_dir(o->save_features, "--save-features", &r->feat_lock_fd);
    if (rc == DFL_OK) rc = er_manifest_load(&r->saved, o->save_features, 0);
    if (rc) return rc;
    if (!o->resume && r->saved.n > 0)
        return dfl_seterr("%s/manifest.jsonl already lists %d saved truths: use --resume to continue that recording, "
                          "or another --save-features",
                          o->save_features, r->saved.n);
    char *mp = dfl_path_join(o->save_features, "manifest.jsonl");
    r->manf = fopen(mp, o->resume ? "a" : "w");
    free(mp);
    return r->manf ? DFL_OK : dfl_seterr("%s/manifest.jsonl: cannot write", o->save_features);
}

/* --out's files: results.jsonl read back (what a resumed run holds) and opened to append. */
static int open_results(run *r) {
    const eval_opts *o = r->o;
    const char *mode = o->resume ? "a" : "w";
    struct stat stt;
    if (!o->resume && stat(r->res_path, &stt) == 0 && stt.st_size > 0)
        return dfl_seterr("%s already holds results: use --resume to continue it, or another --out", r->res_path);
    int rc = er_done_load(&r->done, r->res_path, r->device);
    if (rc) return rc;
    if (o->resume && stat(r->res_path, &stt) == 0 && r->done.good_end < stt.st_size &&
        truncate(r->res_path, r->done.good_end) != 0)
        return dfl_seterr("%s: cannot drop the partial last line", r->res_path);
    /* spread: the writer's dist appends the lines (its own and the others') */
    r->resf = o->dist ? NULL : fopen(r->res_path, mode);
    r->reff = (o->reference || o->reference_url) ? fopen(r->ref_path, mode) : NULL;
    if ((!o->dist && !r->resf) || ((o->reference || o->reference_url) && !r->reff))
        return dfl_seterr("%s: cannot write", o->out);
    r->tm.num_anchors = o->train_anchors, r->tm.seed = (uint64_t)o->seed, r->tm.blocks = o->train_batch;
    if (o->train_metrics && (rc = tm_run_open(&r->tm, o->out, o->resume))) return rc;
    if (o->features_from) {
        char *fp = dfl_path_join(o->out, "features_check.jsonl");
        r->fcf = fp ? fopen(fp, mode) : NULL;
        free(fp);
        if (!r->fcf) return dfl_seterr("%s/features_check.jsonl: cannot write: %s", o->out, strerror(errno));
    }
    return DFL_OK;
}

/* Every input checked and every output opened before any work. */
static int run_open(run *r) {
    const eval_opts *o = r->o;
    char rec_target[4096] = "";
    int rc = DFL_OK;
    if (r->from_features) {
        rc = open_features(r, rec_target, sizeof rec_target);
    } else if ((rc = er_load_prompts(&r->ps, o, &r->zlab_dataset)) == DFL_OK) {
        for (int i = 0; i < r->ps.n_bad; i++)
            er_log(r, "dfl eval: %s:%d: malformed prompt line skipped\n", o->prompts, r->ps.bad_lines[i]);
    }
    if (rc == DFL_OK) rc = open_target(r, o->target ? o->target : rec_target);
    /* a worker of a spread run writes nothing: its lines go to the writer */
    if (rc == DFL_OK && r->writes && (rc = er_mkdir_p(o->out)) == DFL_OK)
        rc = er_lock_dir(o->out, "--out", &r->lock_fd);
    if (rc == DFL_OK && o->save_features) rc = open_save_features(r);
    if (rc == DFL_OK && o->dump_prompts && !(r->dumpf = fopen(o->dump_prompts, "w")))
        rc = dfl_seterr("%s: cannot create: %s", o->dump_prompts, strerror(errno));
    if (rc) return rc;
    r->res_path = dfl_path_join(o->out, "results.jsonl");
    r->ref_path = dfl_path_join(o->out, "reference.jsonl");
    return r->writes ? open_results(r) : DFL_OK;
}

/* ---- plan: the units of this process and what each lacks --------------------------------- */

/* Every prompt's turns tokenized to size the states (a second turn adds an answer of --max-new
 * and its template); the first turn's ids are kept for the run and the costs. A first turn past
 * the positions the target was trained for is refused before any work (a second turn's length
 * is known once the first is answered: checked then). */
static int size_prompts(run *r) { /* and weighs the units of the shard */
    const eval_opts *o = r->o;
    const int maxpos = r->m.cfg.max_position;
    r->ids0 = calloc((size_t)r->ps.n + 1, sizeof *r->ids0);
    r->n_ids0 = calloc((size_t)r->ps.n + 1, sizeof *r->n_ids0);
    if (!r->ids0 || !r->n_ids0) return dfl_seterr("out of memory");
    for (int i = 0; i < r->ps.n; i++) {
        const eval_prompt *p = &r->ps.p[i];
        int need = 0;
        long w = 0;
        for (int t = 0; t < (o->first_turn ? 1 : p->n_turns); t++) {
            char *txt = prompt_format(p->turns[t], (dfl_chat)o->chat);
            int32_t *ids = NULL;
            size_t n = 0;
            const int rc = txt ? tok_encode(r->tok, txt, strlen(txt), &ids, &n) : dfl_seterr("out of memory");
            free(txt);
            if (rc != DFL_OK) return dfl_preperr("prompt %s", p->id);
            need += (int)n + (t ? r->max_new + 8 : 0);
            w += (long)n + r->max_new;
            if (t) free(ids);
            else r->ids0[i] = ids, r->n_ids0[i] = (int)n;
            if (t == 0 && maxpos > 0 && (long)n + r->max_new > maxpos)
                return dfl_seterr("%s:%d: prompt %s: %zu prompt tokens + --max-new %d = %ld positions exceed the "
                                  "target's max_position_embeddings %d (drop the prompt, shorten it or lower "
                                  "--max-new)",
                                  o->prompts, p->line, p->id, n, r->max_new, (long)n + r->max_new, maxpos);
        }
        r->max_prompt = need > r->max_prompt ? need : r->max_prompt;
        if (i % o->shard_n == o->shard_i) r->plan[i / o->shard_n].weight = w; /* list_units' order */
    }
    return DFL_OK;
}

/* The units of this process's shard: prompts, or saved truths (weighed by their tokens). */
static int list_units(run *r) {
    const eval_opts *o = r->o;
    const int n_all = r->from_features ? r->saved.n : r->ps.n;
    if (!(r->plan = calloc((size_t)n_all + 1, sizeof *r->plan))) return dfl_seterr("out of memory");
    for (int i = 0; i < n_all; i++) {
        work *w = &r->plan[r->n_plan];
        if (r->from_features) {
            const mf_entry *u = &r->saved.u[i];
            if (u->index % o->shard_n != o->shard_i) continue;
            w->weight = u->prompt_tokens + u->tokens;
            r->max_prompt = u->prompt_tokens > r->max_prompt ? u->prompt_tokens : r->max_prompt;
        } else if (i % o->shard_n != o->shard_i) {
            continue; /* a prompt's weight: size_prompts */
        }
        w->item = i;
        r->n_plan++;
    }
    return DFL_OK;
}

/* The units, what each lacks, run.json; a spread run's writer hands the units out. */
static int run_plan(run *r) {
    const eval_opts *o = r->o;
    int rc = list_units(r);
    if (rc == DFL_OK && !r->from_features) rc = size_prompts(r);
    for (int k = 0; k < r->n_plan && rc == DFL_OK; k++) rc = er_plan_unit(r, &r->plan[k]);
    if (rc == DFL_OK && r->writes) rc = er_write_run_json(r);
    if (rc == DFL_OK && o->dist) rc = er_plan_dist(r);
    /* lines will be added: the reports of what results.jsonl held no longer describe it (a run that
     * ends early, or a spread run whose writer dies, must not leave them as if they did) */
    if (rc == DFL_OK && r->writes && !er_plan_complete(r)) rc = eval_remove_reports(o->out);
    return rc;
}

/* ---- run: the plan's units ---------------------------------------------------------------- */

/* The target on its device, the states and buffers sized for the longest unit, the costs of the
 * modeled speedups (on the first prompt), the features directory's target.json. */
static int run_prepare(run *r, unit_bufs *b) {
    const eval_opts *o = r->o;
    const int tree_slots = o->online ? r->max_budget : r->rec_budget;
    const int max_ctx = o->max_ctx ? o->max_ctx : r->max_prompt + r->max_new + tree_slots + r->max_block;
    const int chunk = r->max_prompt < 512 ? r->max_prompt : 512;
    int batch = chunk > r->max_block ? chunk : r->max_block, rc = DFL_OK;
    if (tree_slots + 1 > batch) batch = tree_slots + 1;
    if (r->m.st.place_s >= 1.0) /* a large target's copy is a visible pause: say what it was */
        er_log(r,
               "dfl eval: target's weights copied into aligned memory (%.2f GB in %.1f s; --weights map reads "
               "them in place)\n",
               r->m.st.placed_bytes / 1e9, r->m.st.place_s);
    if (!r->from_features && o->device != DFL_DEVICE_CPU) { /* the target's forwards run there, the drafters here */
        const double t0 = dfl_now();
        if ((rc = model_use_device(&r->m, (dfl_device)o->device))) return rc;
        er_log(r, "dfl eval: target on %s (%.2f GB of weights uploaded in %.1f s)\n",
               dfl_device_name((dfl_device)o->device), r->m.weight_bytes / 1e9, dfl_now() - t0);
    }
    r->batch = batch;
    if ((rc = er_alloc_states(r, max_ctx, batch))) return rc;
    if ((rc = er_alloc_replay_batch(r, max_ctx))) return rc;
    if (r->replay && !r->from_features && o->cost_reps > 0 && r->ps.n > 0)
        rc = eval_costs_measure(&r->costs, &r->m, &r->dif[0], r->ids0[0], r->n_ids0[0], r->block, o->n_drafters,
                                o->budgets, o->n_modes, o->cost_reps);
    else if (r->from_features) er_costs_load(&r->costs, o->features_dir);
    if (rc == DFL_OK && o->save_features) rc = er_target_json(r, 0);
    b->truth = malloc((size_t)(r->max_new + r->max_block) * sizeof(int32_t));
    b->out = malloc((size_t)(r->max_new + r->max_block) * sizeof(int32_t));
    b->max_ctx = max_ctx, b->tree_slots = tree_slots;
    if (rc == DFL_OK && (!b->truth || !b->out)) rc = dfl_seterr("out of memory");
    if (rc == DFL_OK) rc = eval_truth_init(&b->t, r->m.cfg.hidden, r->layers, r->n_layers);
    return rc;
}

/* Prompt w->item, every planned turn: replay or online. */
static int run_prompt(run *r, const work *w, unit_bufs *b, double *last_tau) {
    const eval_opts *o = r->o;
    const int i = w->item;
    const eval_prompt *p = &r->ps.p[i];
    char *answer1 = NULL;
    int rc = DFL_OK;
    for (int turn = 0; turn < w->n_turns && rc == DFL_OK; turn++) {
        int32_t *pids = turn ? NULL : r->ids0[i]; /* the first turn was tokenized when planning */
        size_t np = turn ? 0 : (size_t)r->n_ids0[i];
        char *txt = turn || r->dumpf ? er_turn_text(p, turn, answer1 ? answer1 : "", (dfl_chat)o->chat) : NULL;
        if ((turn || r->dumpf) && !txt) rc = dfl_seterr("out of memory");
        if (rc == DFL_OK && turn) rc = tok_encode(r->tok, txt, strlen(txt), &pids, &np);
        if (rc == DFL_OK && r->dumpf)
            rc = er_dump_prompt(r->dumpf, o->dump_prompts, i, p, turn, answer1 ? answer1 : "", txt, pids, np);
        free(txt);
        const int maxpos = r->m.cfg.max_position;
        if (rc == DFL_OK && maxpos > 0 && (long)np + r->max_new > maxpos)
            rc = dfl_seterr("prompt %s turn %d: %zu prompt tokens + --max-new %d = %ld positions exceed the target's "
                            "max_position_embeddings %d",
                            p->id, turn + 1, np, r->max_new, (long)np + r->max_new, maxpos);
        if (rc == DFL_OK && (int)np + r->max_new + b->tree_slots > b->max_ctx)
            rc = dfl_seterr("prompt %s turn %d: %zu tokens + --max-new %d exceed the context %d", p->id, turn + 1, np,
                            r->max_new, b->max_ctx);
        int n_truth = 0;
        const turn_plan *tp = &w->turn[turn];
        if (rc == DFL_OK)
            rc = r->replay ? er_unit_replay(r, p, i, turn, tp, pids, (int)np, b, &n_truth, last_tau)
                           : er_unit_online(r, p->id, turn, tp, pids, (int)np, b->truth, &n_truth, b->out, last_tau);
        if (rc == DFL_OK && turn == 0 && w->n_turns > 1)
            answer1 = prompt_decode(r->tok, b->truth, (size_t)n_truth, NULL);
        if (turn) free(pids);
    }
    free(answer1);
    return rc;
}

/* The next unit: this process's next, or the one the dist hands out (-1: none left). A unit
 * handed over with lines held elsewhere is planned again with them. */
static int next_unit(run *r, int j, int *k) {
    const eval_dist *dd = r->o->dist;
    if (!dd) {
        *k = j < r->n_plan ? j : -1;
        return DFL_OK;
    }
    char *held = NULL;
    int rc = dd->next(dd->ud, k, &held);
    if (rc == DFL_OK && *k >= 0 && held && (rc = er_done_add_text(&r->done, held, r->device)) == DFL_OK)
        rc = er_plan_unit(r, &r->plan[*k]);
    free(held);
    return rc;
}

/* Run the plan: each unit computes the rows it lacks, nothing else. */
static int run_units(run *r, unit_bufs *b) {
    const eval_opts *o = r->o;
    eval_progress pg = {.total = r->n_plan};
    int rc = DFL_OK, k;
    for (int j = 0; rc == DFL_OK && (rc = next_unit(r, j, &k)) == DFL_OK && k >= 0; j++) {
        const work *w = &r->plan[k];
        double last_tau = 0;
        rc = r->from_features ? er_unit_saved(r, w, b, &last_tau) : run_prompt(r, w, b, &last_tau);
        pg.done++, pg.last_tau = last_tau;
        pg.what = r->from_features ? r->saved.u[w->item].prompt_id : r->ps.p[w->item].id;
        if (rc == DFL_OK && o->on_progress) o->on_progress(o->progress_ud, &pg);
    }
    return rc == DFL_OK ? er_replay_flush(r) : rc;
}

/* ---- close: the reports ------------------------------------------------------------------- */

/* A spread run's writer waits for the others; what is missing (units no process finished, the
 * saved features' missing part) goes into the reports and the outcome. */
static int run_close(run *r) {
    const eval_opts *o = r->o;
    char *missing = NULL;
    int rc = DFL_OK;
    if (o->dist && o->dist->writer && o->dist->finish(o->dist->ud) != DFL_OK) missing = strdup(dfl_errmsg());
    if (r->writes && r->feat_incomplete) { /* the features hold only part of the prompts */
        const size_t n = strlen(r->feat_incomplete) + (missing ? strlen(missing) + 2 : 0) + 1;
        char *m = malloc(n);
        if (m) snprintf(m, n, "%s%s%s", missing ? missing : "", missing ? "; " : "", r->feat_incomplete);
        free(missing);
        missing = m;
    }
    if (o->save_features) rc = er_target_json(r, 1); /* every truth is saved */
    if (rc == DFL_OK && r->writes) {
        if (r->resf) fclose(r->resf);
        r->resf = NULL;
        rc = er_write_summary(r, missing);
    }
    if (rc == DFL_OK && missing) rc = dfl_seterr("%s", missing);
    free(missing);
    return rc;
}

/* Open, plan, prepare, run the plan, close. */
int eval_run(const eval_opts *o, eval_outcome *res) {
    run rr, *r = &rr;
    memset(r, 0, sizeof *r);
    r->o = o;
    r->lock_fd = r->feat_lock_fd = -1;
    r->max_new = o->max_new;
    r->replay = !o->online;
    r->from_features = o->features_dir != NULL;
    r->device = o->device;
    r->writes = !o->dist || o->dist->writer;
    r->rec_auto = o->record_budget == EVAL_RECORD_AUTO;
    snprintf(r->recorder, sizeof r->recorder, "dfl");
    r->rec_budget = o->record_budget >= 0 ? o->record_budget : r->rec_auto ? 0 : o->budgets[0];
    for (int k = 0; k < o->n_modes; k++) r->max_budget = o->budgets[k] > r->max_budget ? o->budgets[k] : r->max_budget;
    memset(res, 0, sizeof *res);
    int rc = eval_opts_check(o);
    if (rc) return rc;
    unit_bufs ub;
    memset(&ub, 0, sizeof ub);
    rc = run_open(r);
    if (rc == DFL_OK) rc = run_plan(r);
    if (rc == DFL_OK) rc = run_prepare(r, &ub);
    if (rc == DFL_OK) rc = run_units(r, &ub);
    eval_truth_free(&ub.t);
    free(ub.truth), free(ub.out);
    if (rc == DFL_OK) rc = run_close(r);
    *res = r->res;
    run_free(r);
    return rc;
}
