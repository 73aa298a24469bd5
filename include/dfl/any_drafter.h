/* Any drafter behind one name, as the CLI's --drafter and the server take it: a DFlash or DFlash2
 * drafter directory, the target's own MTP head ("mtp") or the MTP head of checkpoint DIR
 * ("DIR:mtp"). Opens it against the target, settles the block size and gives the run state as the
 * speculative loop's dfl_draft_if, so generate, serve and bench open every kind the same way. */
#ifndef DFL_ANY_DRAFTER_H
#define DFL_ANY_DRAFTER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dfl/drafter.h"
#include "dfl/model.h"
#include "dfl/mtp.h"
#include "dfl/spec.h"

typedef enum dfl_drafter_kind { DFL_DRAFTER_DFLASH = 0, DFL_DRAFTER_DFLASH2 = 1, DFL_DRAFTER_MTP = 2 } dfl_drafter_kind;

typedef struct dfl_any_drafter {
    dfl_drafter_kind kind;
    int block;            /* verification block B: the one asked for, else the drafter's block_size
                           * (DFlash, DFlash2) or DFL_MTP_DEFAULT_BLOCK (MTP) */
    dfl_drafter d;        /* DFlash / DFlash2 */
    dfl_mtp mtp;          /* MTP head */
    dfl_drafter_state ds; /* run state of d, after anydrafter_state_init */
    dfl_mtp_state ms;     /* run state of mtp, after anydrafter_state_init */
    int have_state;
    int mtp_layer;         /* MTP: the target decoder layer its features come from (the last) */
    uint64_t weight_bytes; /* bytes of the drafter's own tensors */
} dfl_any_drafter;

/* Open the drafter arg names for target t (target_dir: what "mtp" means). block 0 = the default;
 * else it must be in [2, block_size] (DFlash, DFlash2) or [2, DFL_MAX_BLOCK] (MTP). A DFlash
 * drafter is checked against the target (drafter_check_target); a mismatch that still runs (its
 * num_target_layers) is written into warning (len bytes; "" when none). On DFL_ERR nothing stays
 * open and the message names arg. */
int anydrafter_open(dfl_any_drafter *a, const char *arg, const dfl_model *t, const char *target_dir, int block,
                    int check_weights, char *warning, size_t len);

/* Block attention of a DFlash / DFlash2 drafter (drafter_set_causal: -1, 0, 1, or
 * DFL_BLOCK_ATTN_AUTO for the config's). An MTP head has no block attention: it takes AUTO only,
 * anything else is DFL_ERR. Before or after anydrafter_state_init. */
int anydrafter_set_causal(dfl_any_drafter *a, int causal);
/* drafter_attn_semantics of a DFlash / DFlash2 drafter; NULL for an MTP head. */
const char *anydrafter_attn_semantics(const dfl_any_drafter *a);
/* For JSON reports: `, "block_attention": {drafter_attn_json}` onto f; nothing for an MTP head. */
void anydrafter_attn_json(FILE *f, const dfl_any_drafter *a);

/* Allocate the run state for max_ctx positions and blocks of a->block; *dif drives it (its
 * context empty). */
int anydrafter_state_init(dfl_any_drafter *a, const dfl_model *t, int max_ctx, dfl_draft_if *dif);

/* The target decoder layers whose outputs make the drafter's feature (known once open; the same
 * as the dfl_draft_if's feature_layers): *ids, and their count is returned. */
int anydrafter_feature_layers(const dfl_any_drafter *a, const int **ids);

/* Bytes of the run state (0 before anydrafter_state_init). */
uint64_t anydrafter_state_bytes(const dfl_any_drafter *a);

/* "dflash", "dflash2" or "mtp". */
const char *anydrafter_kind_name(dfl_drafter_kind k);

/* Free the run state (if any) and close the drafter. */
void anydrafter_close(dfl_any_drafter *a);

#endif
