/* The copies each rollback strategy of a hybrid (Gated DeltaNet) model makes per round, timed on
 * the live CPU state (dfl bench; include/dfl/model.h target_state_rollback_costs). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"
#include "dfl/common.h"
#include "dfl/model.h"

int target_state_rollback_costs(dfl_target_state *s, int B, int reps, dfl_rollback_costs *c) {
    const dfl_model *m = s->m;
    const dfl_config *g = &m->cfg;
    memset(c, 0, sizeof *c);
    if (m->be != &dfl_backend_cpu) return dfl_seterr("rollback copies are measured on the CPU state only");
    if (B < 1 || B > s->max_batch) return dfl_seterr("rollback costs: %d tokens, the state holds %d", B, s->max_batch);
    const size_t conv = (size_t)(g->conv_kernel - 1) * m->conv_dim;
    const size_t S = (size_t)g->lin_v_heads * g->lin_k_dim * g->lin_v_dim;
    const size_t rec_n = conv + S + (size_t)B * ((size_t)m->conv_dim + 2 * (size_t)g->lin_v_heads);
    int n_lin = 0;
    for (int i = 0; i < g->n_layers; i++) n_lin += g->layer_types[i] == DFL_LAYER_LINEAR;
    c->record_mb = n_lin * rec_n * sizeof(float) / 1e6;
    c->snap_mb = (double)n_lin * B * (conv + S) * sizeof(float) / 1e6;
    if (!n_lin) return DFL_OK;
    float *rec = malloc(rec_n * sizeof(float)), *back = malloc((conv + S) * sizeof(float));
    float *snap = malloc((size_t)n_lin * B * (conv + S) * sizeof(float));
    if (!rec || !back || !snap) {
        free(rec), free(back), free(snap);
        return dfl_seterr("out of memory for the rollback measurement");
    }
    double rec_best = 1e30, save_best = 1e30, restore_best = 1e30;
    for (int rep = 0; rep < reps + 1; rep++) { /* the first run warms up */
        /* replay: each linear layer's state and conv window before the forward, B tokens of inputs */
        double t0 = dfl_now();
        for (int li = 0; li < g->n_layers; li++) {
            if (g->layer_types[li] != DFL_LAYER_LINEAR) continue;
            memcpy(rec, s->conv_state[li], conv * sizeof(float));
            memcpy(rec + conv, s->rec_state[li], S * sizeof(float));
            memcpy(rec + conv + S, s->q, (size_t)B * m->conv_dim * sizeof(float));
            memcpy(rec + conv + S + (size_t)B * m->conv_dim, s->ab, (size_t)B * 2 * g->lin_v_heads * sizeof(float));
        }
        const double t_rec = dfl_now() - t0;
        /* snapshots: state and window after each of the B tokens, one of them back on rollback */
        t0 = dfl_now();
        float *d = snap;
        for (int li = 0; li < g->n_layers; li++) {
            if (g->layer_types[li] != DFL_LAYER_LINEAR) continue;
            for (int t = 0; t < B; t++, d += conv + S) {
                memcpy(d, s->conv_state[li], conv * sizeof(float));
                memcpy(d + conv, s->rec_state[li], S * sizeof(float));
            }
        }
        const double t_save = dfl_now() - t0;
        t0 = dfl_now();
        for (int l = 0; l < n_lin; l++)
            memcpy(back, snap + ((size_t)l * B + B / 2) * (conv + S), (conv + S) * sizeof(float));
        const double t_restore = dfl_now() - t0;
        if (rep > 0) {
            rec_best = t_rec < rec_best ? t_rec : rec_best;
            save_best = t_save < save_best ? t_save : save_best;
            restore_best = t_restore < restore_best ? t_restore : restore_best;
        }
    }
    c->record_ms = 1e3 * rec_best, c->snap_save_ms = 1e3 * save_best, c->snap_restore_ms = 1e3 * restore_best;
    free(rec), free(back), free(snap);
    return DFL_OK;
}
