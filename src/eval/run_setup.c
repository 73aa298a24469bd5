/* What a run opens: its directories (locked), the drafters and the truth's layers, the states. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "dfl/common.h"
#include "eval/run.h"

int er_mkdir_p(const char *dir) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return dfl_seterr("%s: cannot create directory", dir);
    return DFL_OK;
}

/* Exclusive use of a directory (--out, --save-features) while the run writes it. */
int er_lock_dir(const char *dir, const char *what, int *fd) {
    char *path = dfl_path_join(dir, ".lock");
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    int rc = DFL_OK;
    if (*fd < 0) rc = dfl_seterr("%s: cannot open: %s", path, strerror(errno));
    else if (flock(*fd, LOCK_EX | LOCK_NB) != 0)
        rc = dfl_seterr("%s: another dfl eval is writing this directory (%s is locked); wait for it or use another "
                        "%s",
                        dir, path, what);
    free(path);
    return rc;
}

/* A DFlash drafter fills its blocks with the mask token its training added: a mask_token_id that
 * is an ordinary token of the tokenizer (an id past the tokenizer, in the padded embedding, is
 * fine: z-lab's drafters use one) is most likely wrong and costs τ silently. Said on stderr now
 * and at the top of summary.md. */
int er_check_mask_tokens(run *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = r->tok ? open_memstream(&buf, &len) : NULL;
    if (!m) return r->tok ? dfl_seterr("out of memory") : DFL_OK;
    for (int d = 0; d < r->n_open; d++) {
        const int32_t id = r->ad[d].d.cfg.mask_token_id;
        if (r->ad[d].kind == DFL_DRAFTER_MTP || !tok_has_id(r->tok, id) || tok_is_added(r->tok, id)) continue;
        char *txt = tok_decode(r->tok, &id, 1, 0);
        fprintf(m, "- **%s: mask_token_id %d is an ordinary token** (", r->label[d], id);
        dfl_json_write_string(m, txt ? txt : "?");
        fprintf(m, "), not a special or added token of the tokenizer: the drafter reads a real word where its training "
                   "put the mask, which costs τ silently. Check dflash_config.mask_token_id against the tokenizer it "
                   "was trained with.\n");
        er_log(r,
               "dfl eval: warning: drafter %s: mask_token_id %d is an ordinary token of the tokenizer (%s), not a "
               "special or added one: check dflash_config.mask_token_id against the tokenizer it was trained with\n",
               r->label[d], id, txt ? txt : "?");
        free(txt);
    }
    fclose(m);
    if (len) r->warn_md = buf;
    else free(buf);
    return DFL_OK;
}

int er_open_drafters(run *r) {
    const eval_opts *o = r->o;
    for (; r->n_open < o->n_drafters; r->n_open++) {
        dfl_any_drafter *a = &r->ad[r->n_open];
        char warn[512];
        if (anydrafter_open(a, o->drafters[r->n_open], &r->m, r->m.dir, o->block, 0, warn, sizeof warn) != DFL_OK)
            return DFL_ERR;
        if (warn[0]) er_log(r, "dfl eval: warning: %s\n", warn);
        if (o->block_attn != DFL_BLOCK_ATTN_AUTO && anydrafter_set_causal(a, o->block_attn) != DFL_OK) {
            anydrafter_close(a);
            return dfl_preperr("--block-attn");
        }
        if (a->kind == DFL_DRAFTER_MTP) { /* labelled by the checkpoint its head comes from */
            const size_t len = strlen(a->mtp.dir) + 8;
            if ((r->label[r->n_open] = malloc(len))) snprintf(r->label[r->n_open], len, "mtp (%s)", a->mtp.dir);
        } else {
            r->label[r->n_open] = strdup(o->drafters[r->n_open]);
        }
        if (!r->label[r->n_open]) {
            anydrafter_close(a);
            return dfl_seterr("out of memory");
        }
        r->block[r->n_open] = a->block;
        r->max_block = a->block > r->max_block ? a->block : r->max_block;
    }
    /* the truth's layers: every drafter's, and --save-layers */
    int all[EVAL_MAX_FEAT_LAYERS * 2], n = 0;
    for (int d = 0; d < o->n_drafters; d++) {
        const int *ids;
        const int nd = anydrafter_feature_layers(&r->ad[d], &ids);
        for (int i = 0; i < nd && n < EVAL_MAX_FEAT_LAYERS; i++) all[n++] = ids[i];
    }
    if (o->n_save_layers < 0)
        for (int k = 0; k < r->m.cfg.n_layers && n < 2 * EVAL_MAX_FEAT_LAYERS; k++) all[n++] = k;
    for (int i = 0; i < o->n_save_layers && n < 2 * EVAL_MAX_FEAT_LAYERS; i++) {
        if (o->save_layers[i] < 0 || o->save_layers[i] >= r->m.cfg.n_layers)
            return dfl_seterr("--save-layers: layer %d does not exist; the target has decoder layers 0..%d",
                              o->save_layers[i], r->m.cfg.n_layers - 1);
        all[n++] = o->save_layers[i];
    }
    /* --train-metrics: the target's last layer gives its distribution (unless saved truths lack it) */
    const int last = r->m.cfg.n_layers - 1;
    if (o->train_metrics && n < 2 * EVAL_MAX_FEAT_LAYERS &&
        (!r->from_features || er_saved_layer(o->features_dir, last)))
        all[n++] = last;
    eval_truth t;
    if (eval_truth_init(&t, r->m.cfg.hidden, all, n)) return DFL_ERR;
    r->n_layers = t.n_layers;
    memcpy(r->layers, t.layers, sizeof r->layers);
    r->last_col = o->train_metrics ? eval_truth_column(&t, last) : -1;
    int read = o->n_save_layers < 0;
    for (int i = 0; i < n - (r->last_col >= 0); i++) read |= all[i] == last;
    r->last_optional = r->last_col >= 0 && !read ? last : -1;
    for (int d = 0; d < o->n_drafters; d++) {
        const int *ids;
        const int nd = anydrafter_feature_layers(&r->ad[d], &ids);
        for (int i = 0; i < nd; i++) r->col[d][i] = eval_truth_column(&t, ids[i]);
    }
    return DFL_OK;
}

/* The states, sized for the longest unit: ctx positions, batch tokens per forward. */
int er_alloc_states(run *r, int max_ctx, int batch) {
    const eval_opts *o = r->o;
    if (!r->from_features) {
        if (target_state_init(&r->st, &r->m, max_ctx, batch, 1) != DFL_OK) return DFL_ERR;
        r->have_state = 1;
        int online_trees = 0;
        if (o->online) online_trees = r->max_budget;
        else online_trees = r->rec_budget;
        if (online_trees && target_state_enable_tree(&r->st, online_trees + 1) != DFL_OK) return DFL_ERR;
    }
    for (; r->n_dstate < o->n_drafters; r->n_dstate++) {
        const int d = r->n_dstate;
        if (anydrafter_state_init(&r->ad[d], &r->m, max_ctx, &r->dif[d]) != DFL_OK) return DFL_ERR;
    }
    if (!o->online)
        for (; r->n_cache < o->n_drafters; r->n_cache++)
            if (eval_draft_cache_init(&r->cache[r->n_cache], r->max_budget, r->m.cfg.vocab, r->block[r->n_cache]))
                return DFL_ERR;
    return DFL_OK;
}

int er_alloc_replay_batch(run *r, int max_ctx) {
    const eval_opts *o = r->o;
    r->replay_batch = o->replay_batch < 1 ? 1 : o->replay_batch;
    if (o->online) return DFL_OK;
    r->pend = calloc((size_t)r->replay_batch, sizeof *r->pend);
    r->bcache = calloc((size_t)r->replay_batch, sizeof *r->bcache);
    if (!r->pend || !r->bcache) return dfl_seterr("out of memory for a replay batch of %d", r->replay_batch);
    for (; r->n_bcache < r->replay_batch; r->n_bcache++)
        if (eval_draft_cache_init(&r->bcache[r->n_bcache], r->max_budget, r->m.cfg.vocab, r->max_block)) return DFL_ERR;
    /* a context per batch slot for the drafters that draft across contexts (DFlash); the others
     * replay one truth at a time on their one state */
    for (int d = 0; d < o->n_drafters && r->replay_batch > 1; d++) {
        if (!r->dif[d].draft_across) continue;
        const int n = r->replay_batch - 1;
        r->xst[d] = calloc((size_t)n, sizeof *r->xst[d]);
        r->xdif[d] = calloc((size_t)n, sizeof *r->xdif[d]);
        if (!r->xst[d] || !r->xdif[d]) return dfl_seterr("out of memory for a replay batch of %d", r->replay_batch);
        for (; r->n_xst[d] < n; r->n_xst[d]++) {
            dfl_drafter_state *x = &r->xst[d][r->n_xst[d]];
            if (drafter_state_init(x, &r->ad[d].d, &r->m, max_ctx, r->ad[d].block) != DFL_OK)
                return dfl_preperr("drafter %s, context %d of the replay batch", r->label[d], r->n_xst[d] + 2);
            r->xdif[d][r->n_xst[d]] = spec_dflash_drafter(x);
        }
    }
    return DFL_OK;
}
