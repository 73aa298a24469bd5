/* DFlash drafter checkpoint loading and compatibility with a target. */
#include "dfl/drafter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "models/loader.h"

static const char *const drafter_prefixes[] = {"", "model.", NULL};

static int bind_dlayer(dfl_drafter *d, ld_ctx *c, int i) {
    const dfl_config *g = &d->cfg;
    dfl_dlayer_w *l = &d->layers[i];
    const int H = g->hidden, hd = g->head_dim;
    char n[512];
#define NAME(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, d->prefix, i), n)
    c->layer = i;
    l->type = g->layer_types[i];
    ld_why(c, "hidden_size %d", H);
    if (!(l->input_norm = ld_vec1(c, NAME("input_layernorm.weight"), H, 0))) return DFL_ERR;
    ld_why(c, "hidden_size %d", H);
    if (!(l->post_norm = ld_vec1(c, NAME("post_attention_layernorm.weight"), H, 0))) return DFL_ERR;
    if (ld_attention(c, NAME(""), H, g->n_heads, g->n_kv_heads, hd, 0, 0,
                     (ld_attn){&l->q_proj, &l->k_proj, &l->v_proj, &l->o_proj, &l->q_norm, &l->k_norm}))
        return DFL_ERR;
    if (ld_mlp(c, NAME(""), H, g->intermediate, &l->gate, &l->up, &l->down)) return DFL_ERR;
    if (g->dflash2) {
        const int T = g->conv_taps, G = H / g->conv_group;
        const int64_t base[3] = {2, T, H};
        const char *const conv[2] = {"attention_conv", "mlp_conv"};
        float **bases[2] = {&l->attn_conv_base, &l->mlp_conv_base};
        dfl_mat *projs[2] = {&l->attn_conv_proj, &l->mlp_conv_proj};
        for (int k = 0; k < 2; k++) {
            snprintf(n, sizeof n, "%slayers.%d.%s.base_kernel", d->prefix, i, conv[k]);
            ld_why(c, "2 sides, conv_kernel_size %d, hidden_size %d", T, H);
            if (!(*bases[k] = ld_vec(c, n, 3, base, 0))) return DFL_ERR;
            snprintf(n, sizeof n, "%slayers.%d.%s.kernel_projection.weight", d->prefix, i, conv[k]);
            ld_why(c, "2 x conv_kernel_size %d x hidden_size %d / conv_group_size %d, hidden_size %d", T, H,
                   g->conv_group, H);
            if (ld_mat(c, n, 2 * T * G, H, projs[k])) return DFL_ERR;
        }
    }
#undef NAME
    c->layer = -1;
    return DFL_OK;
}

static void attn_describe(dfl_drafter *d);

int drafter_open(dfl_drafter *d, const char *dir, int n_target_layers) {
    return drafter_open_checked(d, dir, n_target_layers, 0);
}

int drafter_open_checked(dfl_drafter *d, const char *dir, int n_target_layers, int check_weights) {
    memset(d, 0, sizeof *d);
    d->dir = strdup(dir);
    dfl_config *g = &d->cfg;
    ld_ctx c = {0};
    if (!dfl_is_dir(dir)) {
        dfl_seterr("%s: not a directory", dir);
        goto fail;
    }
    if (config_load(&d->cfg, dir) != DFL_OK) goto fail;
    if (g->arch != DFL_ARCH_DFLASH) {
        dfl_seterr("%s: not a DFlash drafter (architectures lists neither DFlashDraftModel nor DFlash2DraftModel; "
                   "model_type '%s')",
                   dir, g->model_type);
        goto fail;
    }
    if (g->n_target_ids == 0) {
        if (n_target_layers <= 0) {
            dfl_seterr("%s: config has neither target_layer_ids nor num_target_layers; the default layer ids need "
                       "the target's layer count",
                       dir);
            goto fail;
        }
        g->n_target_layers = n_target_layers;
        g->n_target_ids = g->n_layers;
        g->target_ids_default = 1;
        config_default_target_ids(n_target_layers, g->n_layers, g->target_layer_ids);
    }
    if (st_open_dir(&d->st, dir) != DFL_OK) goto fail;
    d->prefix = NULL;
    for (int i = 0; drafter_prefixes[i]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%sfc.weight", drafter_prefixes[i]);
        if (st_find(&d->st, name)) {
            d->prefix = drafter_prefixes[i];
            break;
        }
    }
    if (!d->prefix) {
        dfl_seterr("%s: missing tensor 'fc.weight' (looked for it with prefixes '' and 'model.')", dir);
        goto fail;
    }
    d->used = calloc((size_t)d->st.n_tensors + 1, 1);
    d->layers = calloc((size_t)g->n_layers, sizeof *d->layers);
    if (!d->used || !d->layers) {
        dfl_seterr("%s: out of memory", dir);
        goto fail;
    }
    c = (ld_ctx){.st = &d->st,
                 .where = dir,
                 .used = d->used,
                 .check_weights = check_weights,
                 .place = st_place_decide(&d->st, st_data_bytes(&d->st)),
                 .layer = -1,
                 .n_layers = g->n_layers};
    char n[128];
    snprintf(n, sizeof n, "%sfc.weight", d->prefix);
    ld_why(&c, "hidden_size %d, %d target_layer_ids x hidden_size %d", g->hidden, g->n_target_ids, g->hidden);
    if (ld_mat(&c, n, g->hidden, g->n_target_ids * g->hidden, &d->fc)) goto fail;
    snprintf(n, sizeof n, "%shidden_norm.weight", d->prefix);
    ld_why(&c, "hidden_size %d", g->hidden);
    if (!(d->hidden_norm = ld_vec1(&c, n, g->hidden, 0))) goto fail;
    snprintf(n, sizeof n, "%snorm.weight", d->prefix);
    ld_why(&c, "hidden_size %d", g->hidden);
    if (!(d->norm = ld_vec1(&c, n, g->hidden, 0))) goto fail;
    for (int i = 0; i < g->n_layers; i++)
        if (bind_dlayer(d, &c, i) != DFL_OK) goto fail;
    if (g->dflash2) {
        const int R = g->selector_rank;
        snprintf(n, sizeof n, "%scandidate_selector.hidden_projection.weight", d->prefix);
        ld_why(&c, "selector_rank %d, hidden_size %d", R, g->hidden);
        if (ld_mat(&c, n, R, g->hidden, &d->sel_proj)) goto fail;
        snprintf(n, sizeof n, "%scandidate_selector.predecessor_codebook", d->prefix);
        ld_why(&c, "vocab_size %d, selector_rank %d", g->vocab, R);
        if (ld_mat(&c, n, g->vocab, R, &d->sel_pred)) goto fail;
        snprintf(n, sizeof n, "%scandidate_selector.successor_codebook", d->prefix);
        ld_why(&c, "vocab_size %d, selector_rank %d", g->vocab, R);
        if (ld_mat(&c, n, g->vocab, R, &d->sel_succ)) goto fail;
    }
    if (ld_finish(&c) != DFL_OK) goto fail;
    for (int i = 0; i < d->st.n_tensors; i++)
        if (d->used[i]) d->weight_bytes += d->st.tensors[i].nbytes;
    d->causal_config = g->causal;
    attn_describe(d);
    return DFL_OK;
fail:
    drafter_close(d);
    return DFL_ERR;
}

void drafter_close(dfl_drafter *d) {
    if (d->layers) {
        for (int i = 0; i < d->cfg.n_layers; i++) {
            dfl_dlayer_w *l = &d->layers[i];
            free(l->input_norm), free(l->post_norm), free(l->q_norm), free(l->k_norm);
            free(l->attn_conv_base), free(l->mlp_conv_base);
            dfl_mat *mats[] = {&l->q_proj, &l->k_proj, &l->v_proj,         &l->o_proj,       &l->gate,
                               &l->up,     &l->down,   &l->attn_conv_proj, &l->mlp_conv_proj};
            for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) ld_mat_free(mats[k]);
        }
        free(d->layers);
    }
    ld_mat_free(&d->fc);
    ld_mat_free(&d->sel_proj), ld_mat_free(&d->sel_pred), ld_mat_free(&d->sel_succ);
    free(d->hidden_norm);
    free(d->norm);
    free(d->used);
    st_close(&d->st);
    free(d->dir);
    memset(d, 0, sizeof *d);
}

int drafter_check_target(const dfl_drafter *d, const dfl_model *t) {
    const dfl_config *g = &d->cfg, *tc = &t->cfg;
    char msg[2048] = "";
    size_t k = 0;
#define WHY(...) (k += (size_t)snprintf(msg + k, k < sizeof msg ? sizeof msg - k : 0, __VA_ARGS__))
    if (g->hidden != tc->hidden) WHY("; hidden_size %d != target hidden_size %d", g->hidden, tc->hidden);
    if (g->mask_token_id >= tc->vocab) WHY("; mask_token_id %d >= target vocab_size %d", g->mask_token_id, tc->vocab);
    if (g->vocab && g->vocab != tc->vocab) WHY("; vocab_size %d != target vocab_size %d", g->vocab, tc->vocab);
    /* negative ids come from the default formula over fewer than 4 layers */
    for (int i = 0; i < g->n_target_ids; i++)
        if (g->target_layer_ids[i] < 0 || g->target_layer_ids[i] >= tc->n_layers)
            WHY("; target_layer_ids[%d] = %d but the target has layers 0..%d", i, g->target_layer_ids[i],
                tc->n_layers - 1);
#undef WHY
    if (k) return dfl_seterr("drafter %s does not fit target %s: %s", d->dir, t->dir, msg + 2);
    return DFL_OK;
}

/* z-lab's dflash never compares num_target_layers with the target: a drafter may be used on
 * a target other than its own, as long as the layers it reads exist (drafter_check_target). */
const char *drafter_target_warning(const dfl_drafter *d, const dfl_model *t, char *buf, size_t len) {
    const dfl_config *g = &d->cfg;
    if (!g->n_target_layers || g->n_target_layers == t->cfg.n_layers) return NULL;
    snprintf(buf, len,
             "drafter %s: num_target_layers %d differs from the target's %d layers (the drafter was "
             "trained on another target?)%s",
             d->dir, g->n_target_layers, t->cfg.n_layers,
             g->target_ids_default ? "; its default target_layer_ids follow num_target_layers" : "");
    return buf;
}

/* ---- block attention (docs/design.md §4) ---- */

static const char *const causal_names[4] = {"auto", "sliding-causal", "bidirectional", "causal"};

const char *drafter_causal_name(int causal) {
    return causal >= DFL_BLOCK_ATTN_AUTO && causal <= DFL_BLOCK_ATTN_CAUSAL ? causal_names[causal + 2] : NULL;
}

int drafter_causal_parse(const char *s, int *causal) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, causal_names[i]) == 0) {
            *causal = i - 2;
            return DFL_OK;
        }
    return dfl_seterr("block attention: expected auto, sliding-causal, bidirectional or causal, found '%s'", s);
}

int drafter_has_sliding(const dfl_drafter *d) {
    int n = 0;
    for (int i = 0; i < d->cfg.n_layers; i++) n += d->cfg.layer_types[i] == DFL_LAYER_SLIDING;
    return n;
}

const char *drafter_causal_source(const dfl_drafter *d) {
    if (d->causal_override) return "override";
    return d->cfg.causal_field == DFL_CAUSAL_IS_CAUSAL       ? "is_causal"
           : d->cfg.causal_field == DFL_CAUSAL_DFLASH_CONFIG ? "dflash_config.causal"
                                                             : "default";
}

/* what the layers do: sliding-causal without sliding layers is bidirectional */
static const char *effective_name(const dfl_drafter *d, int causal) {
    return drafter_causal_name(causal < 0 && !drafter_has_sliding(d) ? 0 : causal);
}

static void attn_describe(dfl_drafter *d) {
    const int c = d->cfg.causal, n = drafter_has_sliding(d);
    const char *what = c == 1   ? "causal in every layer"
                       : !n     ? "bidirectional in the block (no sliding layers)"
                       : c == 0 ? "bidirectional in every layer (z-lab reference)"
                                : "sliding layers causal in the block (SpecForge/SGLang), full layers bidirectional";
    const int cc = d->causal_config;
    char from[128];
    if (d->cfg.causal_field == DFL_CAUSAL_UNSET)
        snprintf(from, sizeof from, "default: the config sets neither is_causal nor dflash_config.causal");
    else
        snprintf(from, sizeof from, "config %s = %s",
                 d->cfg.causal_field == DFL_CAUSAL_IS_CAUSAL ? "is_causal" : "dflash_config.causal",
                 cc ? "true" : "false");
    if (d->causal_override)
        snprintf(d->attn_desc, sizeof d->attn_desc, "%s; set at run time (the config's: %s, %s)", what,
                 drafter_causal_name(cc), from);
    else snprintf(d->attn_desc, sizeof d->attn_desc, "%s; %s", what, from);
}

int drafter_set_causal(dfl_drafter *d, int causal) {
    if (causal < DFL_BLOCK_ATTN_AUTO || causal > DFL_BLOCK_ATTN_CAUSAL)
        return dfl_seterr("drafter %s: block attention %d: expected -2 (the config's), -1 (causal in sliding layers), "
                          "0 (bidirectional) or 1 (causal)",
                          d->dir, causal);
    const int override = causal != DFL_BLOCK_ATTN_AUTO, c = override ? causal : d->causal_config;
    const dfl_config *g = &d->cfg;
    /* the config's check (config.c): a bidirectional window must hold the whole block */
    for (int i = 0; i < g->n_layers && c == 0; i++)
        if (g->layer_types[i] == DFL_LAYER_SLIDING && g->sliding_window < g->block_size)
            return dfl_seterr("drafter %s: bidirectional block attention: sliding_window %d is smaller than block_size "
                              "%d in sliding_attention layer %d (the window would cut the block; use sliding-causal "
                              "or causal)",
                              d->dir, g->sliding_window, g->block_size, i);
    d->cfg.causal = c;
    d->causal_override = override;
    attn_describe(d);
    return DFL_OK;
}

const char *drafter_attn_semantics(const dfl_drafter *d) { return d->attn_desc; }

void drafter_attn_json(FILE *f, const dfl_drafter *d) {
    fprintf(f,
            "{\"mode\": \"%s\", \"effective\": \"%s\", \"source\": \"%s\", \"config\": \"%s\", "
            "\"sliding_layers\": %d, \"sliding_window\": %d, \"semantics\": ",
            drafter_causal_name(d->cfg.causal), effective_name(d, d->cfg.causal), drafter_causal_source(d),
            drafter_causal_name(d->causal_config), drafter_has_sliding(d), d->cfg.sliding_window);
    dfl_json_write_string(f, d->attn_desc);
    fputc('}', f);
}
