/* DFlash block drafter (z-lab format, SPEC §4): Qwen3 layers over [context ; block] keys,
 * the target's embedding and lm_head. */
#ifndef DFL_DRAFTER_H
#define DFL_DRAFTER_H

#include "dfl/config.h"
#include "dfl/kernels.h"
#include "dfl/model.h"
#include "dfl/safetensors.h"

typedef struct dfl_dlayer_w {
    dfl_layer_type type;   /* DFL_LAYER_FULL (bidirectional in the block) or DFL_LAYER_SLIDING */
    float *input_norm;     /* [H] */
    float *post_norm;      /* [H] */
    dfl_mat q_proj;        /* [Hq*hd, H] */
    dfl_mat k_proj;        /* [Hkv*hd, H] */
    dfl_mat v_proj;        /* [Hkv*hd, H] */
    dfl_mat o_proj;        /* [H, Hq*hd] */
    float *q_norm, *k_norm;/* [hd] */
    dfl_mat gate, up;      /* [I, H] */
    dfl_mat down;          /* [H, I] */
} dfl_dlayer_w;

typedef struct dfl_drafter {
    dfl_config cfg;        /* cfg.target_layer_ids resolved (default formula applied if needed) */
    st_model st;
    char *dir;
    const char *prefix;    /* "" or "model." */
    dfl_mat fc;            /* [H, n_feat*H] */
    float *hidden_norm;    /* [H] */
    float *norm;           /* [H] final norm */
    dfl_dlayer_w *layers;  /* [L_d] */
    unsigned char *used;   /* [n_tensors] */
    uint64_t weight_bytes;
} dfl_drafter;

/* Open a drafter checkpoint. n_target_layers resolves the default target_layer_ids when the
 * config has neither target_layer_ids nor num_target_layers (pass 0 when unknown). */
int drafter_open(dfl_drafter *d, const char *dir, int n_target_layers);
void drafter_close(dfl_drafter *d);

/* Compatibility of a drafter with a target: hidden size, vocab (mask id), layer ids, block
 * size. Returns DFL_OK or DFL_ERR with every reason in the message. */
int drafter_check_target(const dfl_drafter *d, const dfl_model *target);

#endif
