/* The identity of a target that saved features are checked against (eval_target_identity,
 * src/eval/features.h): kept apart from the features files, which the fuzz build reads without
 * any model code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/safetensors.h"
#include "eval/features.h"

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int eval_target_identity(const dfl_model *m, eval_target_id *id) {
    memset(id, 0, sizeof *id);
    char *path = dfl_path_join(m->dir, "config.json");
    size_t len = 0;
    char *cfg = dfl_read_file(path, &len);
    free(path);
    if (!cfg) return DFL_ERR;
    snprintf(id->config_hash, sizeof id->config_hash, "%016llx",
             (unsigned long long)fnv1a(0xcbf29ce484222325ull, cfg, len));
    free(cfg);
    /* weights: names (without the layout's prefix), shapes and the first bytes of every tensor
     * the forward reads (one page each): tells two fine-tunes of one architecture apart without
     * reading the checkpoint, and is the same for the text and VLM layouts of one model */
    uint64_t h = 0xcbf29ce484222325ull;
    const size_t pl = m->prefix ? strlen(m->prefix) : 0;
    for (int i = 0; i < m->st.n_tensors; i++) {
        const st_tensor *t = &m->st.tensors[i];
        if (!m->used[i]) continue;
        const char *name = pl && strncmp(t->name, m->prefix, pl) == 0 ? t->name + pl : t->name;
        h = fnv1a(h, name, strlen(name));
        h = fnv1a(h, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
        h = fnv1a(h, t->data, t->nbytes < 4096 ? t->nbytes : 4096);
    }
    snprintf(id->weights_hash, sizeof id->weights_hash, "%016llx", (unsigned long long)h);
    snprintf(id->layout, sizeof id->layout, "%s", model_layout_name(m->layout));
    /* a fine-grained FP8 target's layer weights are F8_E4M3 (its embeddings keep their dtype) */
    snprintf(id->dtype, sizeof id->dtype, "%s", m->quant.present ? "F8_E4M3" : st_dtype_name(m->embed.dtype));
    id->n_layers = m->cfg.n_layers, id->hidden = m->cfg.hidden, id->vocab = m->cfg.vocab;
    return DFL_OK;
}
