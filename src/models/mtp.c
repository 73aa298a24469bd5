/* The MTP head of a Qwen3.5/3.6 checkpoint: which drafter argument names it, its tensors. */
#include "dfl/mtp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "models/loader.h"

#define MTP_PREFIX "mtp."

int mtp_parse_arg(const char *arg, const char *target_dir, char *dir, size_t len) {
    static const char suffix[] = ":mtp";
    const size_t n = strlen(arg), ns = sizeof suffix - 1;
    if (strcmp(arg, "mtp") == 0) {
        snprintf(dir, len, "%s", target_dir);
        return 1;
    }
    if (n > ns && strcmp(arg + n - ns, suffix) == 0) {
        snprintf(dir, len, "%.*s", (int)(n - ns), arg);
        return 1;
    }
    return 0;
}

int mtp_count_tensors(const st_checkpoint *st) {
    int n = 0;
    for (int i = 0; i < st->n_tensors; i++) n += strncmp(st->tensors[i].name, MTP_PREFIX, strlen(MTP_PREFIX)) == 0;
    return n;
}

/* Bytes of the mtp.* tensors: the checkpoint may hold a whole model, the head is what is bound. */
static uint64_t head_bytes(const st_checkpoint *st) {
    uint64_t b = 0;
    for (int i = 0; i < st->n_tensors; i++)
        if (strncmp(st->tensors[i].name, MTP_PREFIX, strlen(MTP_PREFIX)) == 0) b += st->tensors[i].nbytes;
    return b;
}

/* dir's text model must be the target's: the head reads its hidden states and shares its
 * embedding and lm_head. */
static int check_config(const dfl_config *g, const dfl_config *tc, const char *dir, const char *tdir) {
    char msg[1024] = "";
    size_t k = 0;
#define WHY(...) (k += (size_t)snprintf(msg + k, k < sizeof msg ? sizeof msg - k : 0, __VA_ARGS__))
    if (g->arch != DFL_ARCH_QWEN3_5)
        WHY("; model_type '%s' has no MTP head (qwen3_5 / qwen3_5_text do)", g->model_type);
    if (g->hidden != tc->hidden) WHY("; hidden_size %d != target's %d", g->hidden, tc->hidden);
    if (g->vocab != tc->vocab) WHY("; vocab_size %d != target's %d", g->vocab, tc->vocab);
    if (g->n_heads != tc->n_heads || g->n_kv_heads != tc->n_kv_heads || g->head_dim != tc->head_dim)
        WHY("; attention heads %d/%d x %d != target's %d/%d x %d", g->n_heads, g->n_kv_heads, g->head_dim, tc->n_heads,
            tc->n_kv_heads, tc->head_dim);
#undef WHY
    if (k) return dfl_seterr("%s: its MTP head does not fit target %s: %s", dir, tdir, msg + 2);
    return DFL_OK;
}

int mtp_open(dfl_mtp *h, const char *dir, const dfl_model *t, int check_weights) {
    memset(h, 0, sizeof *h);
    h->dir = strdup(dir);
    dfl_config g;
    ld_ctx c = {0};
    dfl_layer_w *l = &h->layer;
    int H = 0;
    if (!h->dir) return dfl_seterr("out of memory");
    if (!dfl_is_dir(dir)) {
        dfl_seterr("%s: not a directory (--drafter DIR:mtp names a checkpoint holding mtp.* tensors)", dir);
        goto fail;
    }
    if (config_load(&g, dir) != DFL_OK || check_config(&g, &t->cfg, dir, t->dir) != DFL_OK) goto fail;
    if (st_open_dir(&h->st, dir) != DFL_OK) goto fail;
    if (!(h->n_tensors = mtp_count_tensors(&h->st))) {
        dfl_seterr("%s has no MTP head: no mtp.* tensors in its checkpoint (a text-only export drops them; the "
                   "released vision-language checkpoint carries them: --drafter VLM_DIR:mtp)",
                   dir);
        goto fail;
    }
    if (g.mtp_layers != 1) {
        dfl_seterr("%s: mtp_num_hidden_layers is %d; dfl runs MTP heads of one layer (as every released Qwen3.5/3.6 "
                   "checkpoint has)",
                   dir, g.mtp_layers);
        goto fail;
    }
    h->used = calloc((size_t)h->st.n_tensors + 1, 1);
    if (!h->used) {
        dfl_seterr("%s: out of memory", dir);
        goto fail;
    }
    H = g.hidden;
    h->cfg = g;
    if (quant_load(&h->quant, dir) != DFL_OK) goto fail;
    c = (ld_ctx){.st = &h->st,
                 .where = dir,
                 .used = h->used,
                 .check_weights = check_weights,
                 .quant = &h->quant,
                 .place = st_place_decide(&h->st, head_bytes(&h->st)),
                 .layer = -1};
    l->type = DFL_LAYER_FULL;
    ld_why(&c, "hidden_size %d", H);
    if (!(h->norm_emb = ld_vec1(&c, MTP_PREFIX "pre_fc_norm_embedding.weight", H, 1.0f))) goto fail;
    ld_why(&c, "hidden_size %d", H);
    if (!(h->norm_hidden = ld_vec1(&c, MTP_PREFIX "pre_fc_norm_hidden.weight", H, 1.0f))) goto fail;
    ld_why(&c, "hidden_size %d, 2 x hidden_size %d (embedding ; hidden state)", H, H);
    if (ld_mat(&c, MTP_PREFIX "fc.weight", H, 2 * H, &h->fc)) goto fail;
    ld_why(&c, "hidden_size %d", H);
    if (!(l->input_norm = ld_vec1(&c, MTP_PREFIX "layers.0.input_layernorm.weight", H, 1.0f))) goto fail;
    ld_why(&c, "hidden_size %d", H);
    if (!(l->post_norm = ld_vec1(&c, MTP_PREFIX "layers.0.post_attention_layernorm.weight", H, 1.0f))) goto fail;
    if (ld_attention(&c, MTP_PREFIX "layers.0.", H, g.n_heads, g.n_kv_heads, g.head_dim, 1, 1.0f,
                     (ld_attn){&l->q_proj, &l->k_proj, &l->v_proj, &l->o_proj, &l->q_norm, &l->k_norm}))
        goto fail;
    /* Qwen3.5-MoE heads: a sparse MoE block in the target's layouts (vLLM and SGLang build the MTP
     * layer's MLP from the same config as the target's layers) */
    if (g.n_experts > 0 ? ld_moe(&c, &g, l, MTP_PREFIX "layers.0.")
                        : ld_mlp(&c, MTP_PREFIX "layers.0.", H, g.intermediate, &l->gate, &l->up, &l->down))
        goto fail;
    ld_why(&c, "hidden_size %d", H);
    if (!(h->norm = ld_vec1(&c, MTP_PREFIX "norm.weight", H, 1.0f))) goto fail;
    if (ld_finish(&c) != DFL_OK) goto fail;
    for (int i = 0; i < h->st.n_tensors; i++)
        if (h->used[i]) h->weight_bytes += h->st.tensors[i].nbytes;
    return DFL_OK;
fail:
    mtp_close(h);
    return DFL_ERR;
}

void mtp_close(dfl_mtp *h) {
    ld_layer_free(&h->layer, h->cfg.n_experts);
    ld_mat_free(&h->fc);
    free(h->norm_emb), free(h->norm_hidden), free(h->norm), free(h->used);
    quant_free(&h->quant);
    st_close(&h->st);
    free(h->dir);
    memset(h, 0, sizeof *h);
}
