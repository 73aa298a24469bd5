/* One way to open every kind of drafter (dfl/any_drafter.h). */
#include "dfl/any_drafter.h"

#include <string.h>

#include "dfl/common.h"

int anydrafter_open(dfl_any_drafter *a, const char *arg, const dfl_model *t, const char *target_dir, int block,
                    int check_weights, char *warning, size_t len) {
    memset(a, 0, sizeof *a);
    if (len) warning[0] = '\0';
    char mtp_dir[4096];
    if (mtp_parse_arg(arg, target_dir, mtp_dir, sizeof mtp_dir)) {
        a->block = block ? block : DFL_MTP_DEFAULT_BLOCK;
        if (a->block < 2 || a->block > DFL_MAX_BLOCK)
            return dfl_seterr("block size %d: must be in [2, %d] (B-1 MTP steps)", a->block, DFL_MAX_BLOCK);
        if (mtp_open(&a->mtp, mtp_dir, t, check_weights) != DFL_OK) return dfl_preperr("drafter %s", arg);
        a->kind = DFL_DRAFTER_MTP;
        a->mtp_layer = t->cfg.n_layers - 1;
        a->weight_bytes = a->mtp.weight_bytes;
        return DFL_OK;
    }
    if (drafter_open_checked(&a->d, arg, t->cfg.n_layers, check_weights) != DFL_OK) return DFL_ERR;
    if (drafter_check_target(&a->d, t) != DFL_OK) {
        drafter_close(&a->d);
        return DFL_ERR;
    }
    a->block = block ? block : a->d.cfg.block_size;
    if (a->block < 2 || a->block > a->d.cfg.block_size || a->block > DFL_MAX_BLOCK) {
        dfl_seterr("block size %d: must be in [2, %d] (drafter %s's block_size)", a->block,
                   a->d.cfg.block_size < DFL_MAX_BLOCK ? a->d.cfg.block_size : DFL_MAX_BLOCK, arg);
        drafter_close(&a->d);
        return DFL_ERR;
    }
    if (len) drafter_target_warning(&a->d, t, warning, len);
    a->kind = a->d.cfg.dflash2 ? DFL_DRAFTER_DFLASH2 : DFL_DRAFTER_DFLASH;
    a->weight_bytes = a->d.weight_bytes;
    return DFL_OK;
}

int anydrafter_set_causal(dfl_any_drafter *a, int causal) {
    if (a->kind != DFL_DRAFTER_MTP) return drafter_set_causal(&a->d, causal);
    if (causal == DFL_BLOCK_ATTN_AUTO) return DFL_OK;
    const char *name = drafter_causal_name(causal);
    return dfl_seterr("block attention %s: applies to DFlash and DFlash2 drafters; an MTP head drafts one token "
                      "at a time and has no block attention",
                      name ? name : "(invalid)");
}

const char *anydrafter_attn_semantics(const dfl_any_drafter *a) {
    return a->kind == DFL_DRAFTER_MTP ? NULL : drafter_attn_semantics(&a->d);
}

void anydrafter_attn_json(FILE *f, const dfl_any_drafter *a) {
    if (a->kind == DFL_DRAFTER_MTP) return;
    fprintf(f, ", \"block_attention\": ");
    drafter_attn_json(f, &a->d);
}

int anydrafter_state_init(dfl_any_drafter *a, const dfl_model *t, int max_ctx, dfl_draft_if *dif) {
    if (a->kind == DFL_DRAFTER_MTP) {
        if (mtp_state_init(&a->ms, &a->mtp, t, max_ctx, a->block) != DFL_OK) return DFL_ERR;
        *dif = mtp_drafter_if(&a->ms);
    } else {
        if (drafter_state_init(&a->ds, &a->d, t, max_ctx, a->block) != DFL_OK) return DFL_ERR;
        *dif = spec_dflash_drafter(&a->ds);
    }
    a->have_state = 1;
    return DFL_OK;
}

int anydrafter_feature_layers(const dfl_any_drafter *a, const int **ids) {
    if (a->kind == DFL_DRAFTER_MTP) {
        *ids = &a->mtp_layer;
        return 1;
    }
    *ids = a->d.cfg.target_layer_ids;
    return a->d.cfg.n_target_ids;
}

uint64_t anydrafter_state_bytes(const dfl_any_drafter *a) {
    if (!a->have_state) return 0;
    return a->kind == DFL_DRAFTER_MTP ? a->ms.bytes : a->ds.bytes;
}

const char *anydrafter_kind_name(dfl_drafter_kind k) {
    return k == DFL_DRAFTER_MTP ? "mtp" : k == DFL_DRAFTER_DFLASH2 ? "dflash2" : "dflash";
}

void anydrafter_close(dfl_any_drafter *a) {
    if (a->have_state) {
        if (a->kind == DFL_DRAFTER_MTP) mtp_state_free(&a->ms);
        else drafter_state_free(&a->ds);
    }
    if (a->kind == DFL_DRAFTER_MTP) mtp_close(&a->mtp);
    else drafter_close(&a->d);
    memset(a, 0, sizeof *a);
}
