/* Internal: the DFlash2 pieces of the drafter forward (docs/dflash2.md). */
#ifndef DFL_MODELS_DFLASH2_H
#define DFL_MODELS_DFLASH2_H

#include "dfl/drafter.h"

/* Scratch of a DFlash2 drafter state (nothing for DFlash); DFL_ERR when out of memory. The free
 * leaves the pointers to drafter_state_free, which clears the whole state. */
int dflash2_state_init(dfl_drafter_state *s);
void dflash2_state_free(dfl_drafter_state *s);

/* s->cdelta [B, 2*T*G] = proj(xn): the coefficient deltas of both sides of one sublayer, taken
 * from its normed input xn [B, H]. */
void dflash2_conv_deltas(dfl_drafter_state *s, const dfl_mat *proj, const float *xn, int B);

/* y [B, H] = the grouped depthwise convolution of side `side` over the block rows x [B, H]:
 * y[i][c] = sum over taps t <= i of (base[side][t][c] + delta[i][side][t][c / group]) * x[i-t][c].
 * Taps never reach before the block's first row. y must not alias x. */
void dflash2_conv(const dfl_drafter_state *s, const float *base, int side, const float *x, float *y, int B);

/* The candidate selector over D block positions: hidden [D, H] final-normed hidden states,
 * logits [D, V] their logits on entry, the walk's scores on return (drafter_draft); the
 * candidates and the chosen block are left in s->cand, s->cand_logit and s->walk. */
void dflash2_select(dfl_drafter_state *s, const float *hidden, int32_t anchor, int D, float *logits);

#endif
