/* The backend registry and the target model API's dispatch (dfl/backend.h): every call goes to
 * the backend of the device the model runs on. */
#include <string.h>

#include "backend/backend_internal.h"
#include "dfl/common.h"
#include "dfl/kernels.h"
#include "dfl/model.h"

const dfl_backend *dfl_backend_of(dfl_device d) {
    switch (d) {
    case DFL_DEVICE_CPU: return &dfl_backend_cpu;
#ifdef DFL_HAVE_CUDA
    case DFL_DEVICE_CUDA: return &dfl_backend_cuda;
#endif
    default: return NULL;
    }
}

int dfl_device_built(dfl_device d) { return dfl_backend_of(d) != NULL; }

const char *dfl_devices_built(void) {
#ifdef DFL_HAVE_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

int dfl_device_parse(const char *name, dfl_device *out) {
    for (int d = 0; d < DFL_DEVICE_COUNT; d++)
        if (name && strcmp(name, dfl_device_name((dfl_device)d)) == 0) {
            if (!dfl_device_built((dfl_device)d))
                return dfl_seterr("--device %s: this build has no %s backend (devices built: %s; configure with "
                                  "-DDFL_CUDA=ON for cuda)",
                                  name, name, dfl_devices_built());
            *out = (dfl_device)d;
            return DFL_OK;
        }
    return dfl_seterr("--device '%s': unknown device (devices built: %s)", name ? name : "", dfl_devices_built());
}

int dfl_device_check(dfl_device d) {
    if (!dfl_device_built(d))
        return dfl_seterr("device %s: not built into this dfl (devices built: %s)", dfl_device_name(d),
                          dfl_devices_built());
#ifdef DFL_HAVE_CUDA
    if (d == DFL_DEVICE_CUDA) return cuda_device_check();
#endif
    return DFL_OK;
}

int model_use_device(dfl_model *m, dfl_device d) {
    if (m->device == d && m->be) return DFL_OK;
    if (dfl_device_check(d) != DFL_OK) return DFL_ERR;
    const dfl_backend *be = dfl_backend_of(d);
    if (be->model_upload(m) != DFL_OK) return dfl_preperr("%s: --device %s", m->dir ? m->dir : "model", be->name);
    if (m->be && m->dev && m->be != be) m->be->model_release(m);
    m->device = d;
    m->be = be;
    return DFL_OK;
}

/* ---- the model API, dispatched ------------------------------------------------------- */

/* What every backend's forward relies on, checked once here before it runs (nothing is touched
 * when a check fails). */
static int forward_check(const dfl_target_state *s, const int32_t *tokens, const int *parent, int n,
                         const dfl_capture *cap) {
    const dfl_config *g = &s->m->cfg;
    if (parent && (n < 1 || n > s->tree_cap))
        return dfl_seterr("tree of %d nodes: the run state holds trees of 1..%d nodes (target_state_enable_tree)", n,
                          s->tree_cap);
    if (n < 1 || n > s->max_batch) return dfl_seterr("forward of %d tokens: batch must be in [1, %d]", n, s->max_batch);
    if (s->n_past + n > s->max_ctx)
        return dfl_seterr("context full: %d cached + %d new tokens exceed the maximum context of %d", s->n_past, n,
                          s->max_ctx);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= g->vocab)
            return dfl_seterr("token id %d at batch position %d is outside the vocabulary [0, %d)", tokens[t], t,
                              g->vocab);
    if (!cap) return DFL_OK;
    for (int i = 0; i < cap->n_layers; i++)
        if (cap->layers[i] < 0 || cap->layers[i] >= g->n_layers)
            return dfl_seterr("capture layer %d: the model has decoder layers 0..%d", cap->layers[i], g->n_layers - 1);
    const dfl_feat *f = cap->to;
    if ((cap->out && f) || (!cap->out && !f && cap->n_layers > 0))
        return dfl_seterr("capture: give either host rows (out) or a feature handle (to)");
    if (f && f->device != s->m->device)
        return dfl_seterr("capture: the feature rows are on %s, the model runs on %s", dfl_device_name(f->device),
                          dfl_device_name(s->m->device));
    if (f && (n > f->rows || f->width != cap->n_layers * g->hidden))
        return dfl_seterr("capture of %d tokens x %d layers x %d: the feature handle holds %d rows of %d", n,
                          cap->n_layers, g->hidden, f->rows, f->width);
    return DFL_OK;
}

/* A backend's forward, with a capture into host feature rows given as plain host rows. */
static int run_forward(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, const dfl_fwd_out *out) {
    if (!out->cap || !out->cap->to || !out->cap->to->host) return s->m->be->forward(s, tokens, parent, n, out);
    dfl_capture cap = *out->cap;
    cap.out = cap.to->host, cap.to = NULL;
    dfl_fwd_out o = *out;
    o.cap = &cap;
    return s->m->be->forward(s, tokens, parent, n, &o);
}

int target_state_init(dfl_target_state *s, const dfl_model *m, int max_ctx, int max_batch, int record) {
    return m->be->target_state_init(s, m, max_ctx, max_batch, record);
}

void target_state_free(dfl_target_state *s) {
    if (s->m) s->m->be->target_state_free(s);
    memset(s, 0, sizeof *s);
}

void target_state_reset(dfl_target_state *s) { s->m->be->target_state_reset(s); }

int model_forward_ex(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, const dfl_fwd_out *out) {
    if (forward_check(s, tokens, parent, n, out->cap) != DFL_OK) return DFL_ERR;
    if (out->top_k <= 0) return run_forward(s, tokens, parent, n, out);
    const int V = s->m->cfg.vocab, rows = out->last_only ? 1 : n;
    if (out->top_k > V || !out->logits || !out->top_ids || !out->top_lp)
        return dfl_seterr("forward: top %d of each row needs 1..%d candidates and the logits, ids and log-probability "
                          "buffers",
                          out->top_k, V);
    dfl_fwd_out o = *out; /* no backend summarizes on the device yet: the rows come back */
    o.logits_scratch = 0;
    if (run_forward(s, tokens, parent, n, &o)) return DFL_ERR;
    for (int r = 0; r < rows; r++)
        kn_logsoftmax_top(out->logits + (size_t)r * V, V, out->top_k, out->top_ids + (size_t)r * out->top_k,
                          out->top_lp + (size_t)r * out->top_k);
    return DFL_OK;
}

int model_forward(dfl_target_state *s, const int32_t *tokens, int n, float *logits, int logits_last_only,
                  const dfl_capture *cap) {
    const dfl_fwd_out o = {.logits = logits, .last_only = logits_last_only, .cap = cap};
    return model_forward_ex(s, tokens, NULL, n, &o);
}

int model_forward_tree(dfl_target_state *s, const int32_t *tokens, const int *parent, int n, float *logits,
                       const dfl_capture *cap) {
    const dfl_fwd_out o = {.logits = logits, .cap = cap};
    return model_forward_ex(s, tokens, parent, n, &o);
}

int target_state_rollback(dfl_target_state *s, int keep) {
    if (keep == s->n_past) return DFL_OK;
    if (!s->record || s->rec_n < 0) return dfl_seterr("rollback to %d: the last forward kept no rollback record", keep);
    if (keep < s->rec_n_past || keep > s->rec_n_past + s->rec_n)
        return dfl_seterr("rollback to %d: only positions %d..%d of the last recorded forward can be restored", keep,
                          s->rec_n_past, s->rec_n_past + s->rec_n);
    return s->m->be->rollback(s, keep);
}

int target_state_enable_tree(dfl_target_state *s, int max_nodes) { return s->m->be->enable_tree(s, max_nodes); }

void target_state_disable_tree(dfl_target_state *s) {
    if (s->m) s->m->be->disable_tree(s);
}

int target_state_tree_commit(dfl_target_state *s, const int *path, int len) {
    return s->m->be->tree_commit(s, path, len);
}
