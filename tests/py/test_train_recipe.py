"""Unit tests of the drafter training recipe (tools/train/dflash_recipe.py, docs/design.md §8): anchors respect
the loss mask, blocks and labels (x_{t+k}), the attention mask (a block sees context positions < t
only — never its own anchor's feature or a later one —, all of itself, no other block), the decay
loss weights, and that one masked forward over [context ; many blocks] equals running each block
alone the way inference does (context = features of positions < t)."""
import math
import os
import sys

import torch

from dfltest import SOURCE, Tally

sys.path.insert(0, os.path.join(SOURCE, "tools", "train"))
import dflash_recipe as R  # noqa: E402

t = Tally("train recipe")
torch.manual_seed(0)
g = torch.Generator().manual_seed(0)


def random_mask(T, plen):
    m = torch.zeros(T, dtype=torch.bool)
    m[plen:] = True
    holes = torch.rand(T, generator=g) < 0.1  # some masked-out response tokens too
    return m & ~holes


def test_anchors():
    for trial in range(50):
        T = int(torch.randint(5, 80, (1,), generator=g))
        plen = int(torch.randint(0, T, (1,), generator=g))
        m = random_mask(T, plen)
        valid = R.valid_anchor_positions(m)
        expect = [i for i in range(T - 1) if m[i] and m[i + 1]]
        t.check(valid.tolist() == expect, f"valid anchors {valid.tolist()} != {expect}")
        for k in (1, 4, 512):
            a = R.sample_anchors(m, k, g)
            ok = (len(a) == min(k, len(expect)) and a.tolist() == sorted(set(a.tolist()))
                  and all(bool(m[x]) and x + 1 < T and bool(m[x + 1]) for x in a.tolist()))
            t.check(ok, f"anchors {a.tolist()} break the loss mask / count (max {k})")
    # anchors are random: two draws differ
    m = torch.ones(200, dtype=torch.bool)
    t.check(R.sample_anchors(m, 8, g).tolist() != R.sample_anchors(m, 8, g).tolist(), "anchors are not random")


def test_blocks():
    B, MASK = 16, 999
    T = 40
    ids = torch.randint(0, 900, (T,), generator=g)
    m = torch.zeros(T, dtype=torch.bool)
    m[10:] = True
    a = torch.tensor([10, 17, 30, 38])
    bi, bp, lab, val = R.build_blocks(ids, m, a, B, MASK)
    t.check(bi.shape == (4, B) and lab.shape == (4, B - 1), "block shapes")
    t.check(bi[:, 0].tolist() == ids[a].tolist() and bool((bi[:, 1:] == MASK).all()), "block = [x_t, MASK x 15]")
    t.check(bool((bp == a[:, None] + torch.arange(B)).all()), "block positions t..t+B-1")
    for j, tt in enumerate(a.tolist()):
        for k in range(1, B):
            inside = tt + k < T
            t.check(bool(val[j, k - 1]) == (inside and bool(m[tt + k])), f"label valid block {j} k {k}")
            if inside:
                t.check(int(lab[j, k - 1]) == int(ids[tt + k]), f"label block {j} k {k} != x_(t+k)")


def test_mask():
    B = 16
    for trial in range(20):
        L = int(torch.randint(20, 120, (1,), generator=g))
        valid_len = L - int(torch.randint(0, 10, (1,), generator=g))
        a = torch.randint(1, valid_len - 1, (int(torch.randint(1, 10, (1,), generator=g)),), generator=g)
        a = a.unique().sort().values
        M = R.block_attention_mask(a, B, L, ctx_valid=valid_len)
        n = len(a)
        t.check(M.shape == (n * B, L + n * B), "mask shape")
        for j, tt in enumerate(a.tolist()):
            rows = M[j * B:(j + 1) * B]
            ctx = rows[:, :L]
            t.check(not bool(ctx[:, tt:].any()), f"block {j} (anchor {tt}) sees its anchor's feature or later")
            t.check(bool(ctx[:, :min(tt, valid_len)].all()), f"block {j} misses context positions < t")
            t.check(not bool(ctx[:, valid_len:].any()), "block sees context padding")
            blk = rows[:, L:]
            own = torch.zeros(n * B, dtype=torch.bool)
            own[j * B:(j + 1) * B] = True
            t.check(bool(blk[:, own].all()), f"block {j} is not bidirectional within itself")
            t.check(not bool(blk[:, ~own].any()), f"block {j} sees another block")


def test_weights_and_loss():
    w = R.loss_weights(16, 7.0)
    t.check(len(w) == 15 and abs(float(w[0]) - 1.0) < 1e-7, "w_1 = 1, 15 weights")
    t.check(all(abs(float(w[k - 1]) - math.exp(-(k - 1) / 7)) < 1e-6 for k in range(1, 16)), "w_k = exp(-(k-1)/7)")
    t.check(R.default_gamma(16) == 7 and R.default_gamma(10) == 5 and R.default_gamma(8) == 4, "gamma per block size")
    logits = torch.randn(3, 5, 15, 11, generator=g)
    labels = torch.randint(0, 11, (3, 5, 15), generator=g)
    valid = torch.rand(3, 5, 15, generator=g) < 0.8
    loss, ce_k, acc_k = R.weighted_ce(logits, labels, valid, w)
    num = den = 0.0
    for i in range(3):
        for j in range(5):
            for k in range(15):
                if valid[i, j, k]:
                    ce = -torch.log_softmax(logits[i, j, k], -1)[labels[i, j, k]]
                    num += float(w[k]) * float(ce)
                    den += float(w[k])
    t.check(abs(float(loss) - num / den) < 1e-5, f"weighted loss {float(loss)} != {num / den}")
    # all-valid case: equals sum_k w_k CE_k / sum_k w_k with CE_k the mean over blocks
    loss2, ce2, _ = R.weighted_ce(logits, labels, torch.ones_like(valid), w)
    t.check(abs(float(loss2) - float((w * ce2).sum() / w.sum())) < 1e-5, "loss != sum w_k CE_k / sum w_k")


def test_forward_equivalence():
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config
    B, H, nF, L = 8, 32, 2, 30
    cfg = Qwen3Config(architectures=["DFlashDraftModel"], vocab_size=64, hidden_size=H, num_hidden_layers=2,
                      intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e4}, block_size=B, num_target_layers=4,
                      dflash_config={"mask_token_id": 63, "target_layer_ids": [0, 2]})
    torch.manual_seed(1)
    model = DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.2)
    feat = torch.randn(1, L, nF * H)
    emb = torch.nn.Embedding(64, H)
    ids = torch.randint(0, 60, (L,))
    lm = torch.zeros(L, dtype=torch.bool)
    lm[5:] = True
    a = torch.tensor([5, 11, 12, 20, 28])
    bi, bp, _, _ = R.build_blocks(ids, lm, a, B, 63)
    n = len(a)

    def batched(mask):
        pos = torch.cat([torch.arange(L), bp.flatten()])[None]
        with torch.no_grad():
            return model(position_ids=pos, attention_mask=mask[None, None], noise_embedding=emb(bi).view(1, n * B, H),
                         target_hidden=feat).view(n, B, H)

    out = batched(R.block_attention_mask(a, B, L))
    for j, tt in enumerate(a.tolist()):
        pos = torch.cat([torch.arange(tt), bp[j]])[None]
        with torch.no_grad():
            ref = model(position_ids=pos, noise_embedding=emb(bi[j:j + 1]), target_hidden=feat[:, :tt])[0]
        err = float((out[j] - ref).abs().max())
        t.check(err < 1e-5, f"block {j}: batched-with-mask != block alone with context < t (err {err:.2e})")
    # the `<=` bug (a block sees its anchor's feature) must change the result: the check is sensitive
    leaky = R.block_attention_mask(a, B, L)
    for j, tt in enumerate(a.tolist()):
        leaky[j * B:(j + 1) * B, tt] = True
    t.check(float((batched(leaky) - out).abs().max()) > 1e-3, "a mask seeing the anchor's feature was not detected")


for fn in (test_anchors, test_blocks, test_mask, test_weights_and_loss, test_forward_equivalence):
    t.run(fn)
t.done()
