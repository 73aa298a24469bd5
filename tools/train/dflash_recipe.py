"""The DFlash drafter training recipe (docs/design.md §8) as small pure functions, unit-tested by
tests/py/test_train_recipe.py and used by train_drafter.py.

One training sequence = prompt + the target's own greedy response; loss_mask marks the response.
- anchors: random positions t with loss_mask[t] and loss_mask[t+1] (at most max_anchors, sorted);
- block j = [x_t, MASK x (B-1)] at positions t..t+B-1, labels x_{t+1}..x_{t+B-1} (a label is valid
  only inside the sequence and the loss mask);
- attention: the drafter's queries are the blocks; keys are [context features of every position ;
  all blocks]. Block j sees context positions p < t_j only (never its anchor's own feature, never a
  later one), all of its own B positions (bidirectional), and no other block;
- loss = sum_k w_k CE_k / sum_k w_k over valid (block, k) pairs, w_k = exp(-(k-1)/gamma), k = 1..B-1.
"""
import math

import torch


def valid_anchor_positions(loss_mask):
    """Positions t with loss_mask[t] and loss_mask[t+1] (so at least one label exists)."""
    m = torch.as_tensor(loss_mask, dtype=torch.bool)
    ok = torch.zeros_like(m)
    ok[:-1] = m[:-1] & m[1:]
    return ok.nonzero().flatten()


def sample_anchors(loss_mask, max_anchors, generator=None):
    """Up to max_anchors distinct random anchors among the valid positions, sorted."""
    cand = valid_anchor_positions(loss_mask)
    if len(cand) > max_anchors:
        cand = cand[torch.randperm(len(cand), generator=generator)[:max_anchors]]
    return cand.sort().values


def build_blocks(ids, loss_mask, anchors, block_size, mask_id):
    """block_ids [n, B] (anchor then MASKs), block_pos [n, B] (t..t+B-1), labels [n, B-1] = x_{t+k},
    label_valid [n, B-1] (inside the sequence and loss_mask)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    m = torch.as_tensor(loss_mask, dtype=torch.bool)
    T, n = len(ids), len(anchors)
    a = torch.as_tensor(anchors, dtype=torch.long)
    block_ids = torch.full((n, block_size), mask_id, dtype=torch.long)
    block_ids[:, 0] = ids[a]
    block_pos = a[:, None] + torch.arange(block_size)[None, :]
    lab_pos = block_pos[:, 1:]
    inside = lab_pos < T
    safe = lab_pos.clamp(max=T - 1)
    labels = torch.where(inside, ids[safe], torch.zeros_like(safe))
    label_valid = inside & m[safe]
    return block_ids, block_pos, labels, label_valid


def block_attention_mask(anchors, block_size, ctx_len, ctx_valid=None):
    """Bool [n*B, ctx_len + n*B], True = may attend. Rows: block j's B queries. Columns: context
    positions 0..ctx_len-1, then the n blocks' B positions. ctx_valid (<= ctx_len) cuts off padding."""
    a = torch.as_tensor(anchors, dtype=torch.long)
    n = len(a)
    ctx_valid = ctx_len if ctx_valid is None else ctx_valid
    q_block = torch.arange(n).repeat_interleave(block_size)               # block of each query row
    ctx_pos = torch.arange(ctx_len)
    sees_ctx = (ctx_pos[None, :] < a[q_block][:, None]) & (ctx_pos[None, :] < ctx_valid)
    k_block = torch.arange(n).repeat_interleave(block_size)
    sees_blk = q_block[:, None] == k_block[None, :]
    return torch.cat([sees_ctx, sees_blk], dim=1)


def loss_weights(block_size, gamma=7.0):
    """w_k = exp(-(k-1)/gamma) for k = 1..B-1."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def default_gamma(block_size):
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, 7.0)


def weighted_ce(logits, labels, label_valid, weights):
    """logits [..., B-1, V], labels/label_valid [..., B-1], weights [B-1]:
    sum(w_k * CE * valid) / sum(w_k * valid); also returns per-k mean CE and top-1 accuracy."""
    V = logits.shape[-1]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, V).float(), labels.reshape(-1),
                                           reduction="none").view(labels.shape)
    w = weights.to(ce.dtype) * label_valid.to(ce.dtype)
    loss = (ce * w).sum() / w.sum().clamp_min(1e-9)
    with torch.no_grad():
        v = label_valid.to(ce.dtype)
        dims = tuple(range(ce.dim() - 1))
        cnt = v.sum(dims).clamp_min(1)
        ce_k = (ce * v).sum(dims) / cnt
        acc_k = ((logits.argmax(-1) == labels).to(ce.dtype) * v).sum(dims) / cnt
    return loss, ce_k, acc_k


def cosine_lr(step, total, peak, warmup, floor=0.0):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))
