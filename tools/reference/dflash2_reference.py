"""Minimal PyTorch reference of a DFlash2 drafter (CPU, float32), written for dfl's tests.

There is no runnable DFlash2 peer on a CPU (vLLM's needs its GPU runtime), so this file
re-states the architecture from the public implementation, vLLM's
vllm/model_executor/models/qwen3_dflash2.py (grouped conv, selector, candidates) and
vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py (the greedy selector walk), on top of the
DFlash drafter of vllm/model_executor/models/qwen3_dflash.py; docs/dflash2.md says what each
piece is and where it was read. Written from scratch: no code is copied.

    python tools/reference/dflash2_reference.py --target T --drafter D --ids 1,2,3 --rounds R
        --out F.safetensors [--block-size B]
      greedy speculative decoding of R rounds (the target recomputed on the whole sequence every
      round: exact for dense and hybrid targets alike), recording per round r:
        draft_logits.{r}  F32 [B-1, V]  the proposal's scores: row k is -inf except at the K
                                        candidates of position k+1, each scored from the token
                                        the walk chose at position k (the anchor for k = 0)
        unary.{r}         F32 [B-1, V]  the drafter's own logits (lm_head, multiplier, softcap)
        candidates.{r}    I64 [B-1, K]  top-K ids of each position, best first
        block_ids.{r}     I64 [B]       [anchor, walk tokens] = what the target verified
        start.{r}         I64 [1]       position of the anchor
        accepted.{r}      I64 [1]       accepted drafts
      and output_ids I64 [n] (every committed token after the prompt).

The model class (DFlash2DraftModel) also writes the test fixtures (tools/make_fixtures.py), in
the released tensor layout: fc.weight, hidden_norm.weight, norm.weight, layers.{i}.* (Qwen3
attention and MLP names plus attention_conv / mlp_conv .base_kernel [2, taps, H] and
.kernel_projection.weight [2*taps*H/group, H]), candidate_selector.hidden_projection.weight
[rank, H], candidate_selector.predecessor_codebook / successor_codebook [V, rank].
"""
import argparse
import json
import os
import re

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn


def draft_fields(cfg):
    """The drafter fields of either schema: dflash_config (z-lab) first, top level (speculators) second."""
    inner = cfg.get("dflash_config") or {}

    def get(name, default=None):
        return inner[name] if name in inner else cfg.get(name, default)

    causal = cfg.get("is_causal")
    if causal is None:
        causal = inner.get("causal")
    return {
        "block_size": int(get("block_size", 16)),
        "mask_token_id": int(get("mask_token_id")),
        "target_layer_ids": list(get("target_layer_ids")),
        "conv_kernel_size": int(get("conv_kernel_size")),
        "conv_group_size": int(get("conv_group_size")),
        "selector_rank": int(get("selector_rank")),
        "selector_top_k": int(get("selector_top_k")),
        "input_embedding_scale": float(get("input_embedding_scale", 1.0)),
        "output_multiplier": float(get("output_multiplier", 1.0)),
        "final_logit_softcapping": float(get("final_logit_softcapping") or 0.0),
        "causal": causal,
    }


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        return rms(x, self.weight, self.eps)


class GroupedConv(nn.Module):
    """Dynamic grouped depthwise convolution along the block: out[i, c] = sum_t (base[side, t, c]
    + delta[i, side, t, c // group]) * x[i - t, c], taps reaching before the block's first row
    left out. delta comes from one projection of the sublayer's (normed) input."""

    def __init__(self, hidden, taps, group):
        super().__init__()
        self.taps, self.group, self.groups = taps, group, hidden // group
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)

    def deltas(self, x):  # [B, H] -> [B, 2, taps, groups]
        return self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)

    def apply(self, x, delta, side):  # x [B, H], delta [B, taps, groups]
        B, H = x.shape
        coef = self.base_kernel[side].view(1, self.taps, self.groups, self.group) + delta[..., None]
        xg = x.view(B, self.groups, self.group)
        out = torch.zeros_like(xg)
        for i in range(B):
            for t in range(min(self.taps, i + 1)):
                out[i] += coef[i, t] * xg[i - t]
        return out.view(B, H)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, f):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(H, eps), RMSNorm(H, eps)
        self.self_attn = Attention(c)
        self.mlp = MLP(H, c["intermediate_size"])
        self.attention_conv = GroupedConv(H, f["conv_kernel_size"], f["conv_group_size"])
        self.mlp_conv = GroupedConv(H, f["conv_kernel_size"], f["conv_group_size"])


class Selector(nn.Module):
    def __init__(self, H, V, R):
        super().__init__()
        self.hidden_projection = nn.Linear(H, R, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(V, R))
        self.successor_codebook = nn.Parameter(torch.zeros(V, R))


def rope(x, pos, theta):  # x [n, heads, hd], rotate_half layout
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float()[:, None], torch.cat([ang.sin(), ang.sin()], -1).float()[:, None]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DFlash2DraftModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.f = config, draft_fields(config)
        c, f = config, self.f
        H = c["hidden_size"]
        self.fc = nn.Linear(len(f["target_layer_ids"]) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList(Layer(c, f) for _ in range(c["num_hidden_layers"]))
        self.candidate_selector = Selector(H, c["vocab_size"], f["selector_rank"])
        rp = c.get("rope_parameters") or {}
        self.theta = float(rp.get("rope_theta", c.get("rope_theta", 1e6)))
        self.layer_types = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]

    def mask(self, li, n_ctx, B):
        """[B, n_ctx + B] True where a block query may see a key (absolute positions)."""
        q = torch.arange(n_ctx, n_ctx + B)[:, None]
        k = torch.arange(n_ctx + B)[None, :]
        ok = torch.ones(B, n_ctx + B, dtype=torch.bool)
        sliding = self.layer_types[li] == "sliding_attention"
        causal = self.f["causal"] if self.f["causal"] is not None else sliding  # vLLM's resolution
        if causal:
            ok &= k <= q
        if sliding:
            ok &= q - k < self.config["sliding_window"]
        return ok

    def hidden(self, features, block_embeds):
        """features [n_ctx, k*H] of the committed positions; block_embeds [B, H] (anchor, masks).
        Returns the final-normed hidden states [B, H] of the block."""
        n_ctx, B = features.shape[0], block_embeds.shape[0]
        ctx = self.hidden_norm(self.fc(features))
        x = block_embeds * self.f["input_embedding_scale"]
        pos_c, pos_b = torch.arange(n_ctx), torch.arange(n_ctx, n_ctx + B)
        for li, l in enumerate(self.layers):
            a = l.self_attn
            h = l.input_layernorm(x)
            d = l.attention_conv.deltas(h)
            h2 = l.attention_conv.apply(h, d[:, 0], 0)
            q = rope(a.q_norm(a.q_proj(h2).view(B, a.nh, a.hd)), pos_b, self.theta)
            # context K/V: the fused features as they are (no input norm, no conv)
            kc = rope(a.k_norm(a.k_proj(ctx).view(n_ctx, a.nkv, a.hd)), pos_c, self.theta)
            kb = rope(a.k_norm(a.k_proj(h2).view(B, a.nkv, a.hd)), pos_b, self.theta)
            v = torch.cat([a.v_proj(ctx), a.v_proj(h2)]).view(n_ctx + B, a.nkv, a.hd)
            k = torch.cat([kc, kb])
            rep = a.nh // a.nkv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            s = torch.einsum("qhd,khd->hqk", q, k) / a.hd ** 0.5
            s = s.masked_fill(~self.mask(li, n_ctx, B)[None], float("-inf"))
            o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(B, a.nh * a.hd)
            x = x + l.attention_conv.apply(a.o_proj(o), d[:, 1], 1)
            h = l.post_attention_layernorm(x)
            d = l.mlp_conv.deltas(h)
            x = x + l.mlp_conv.apply(l.mlp(l.mlp_conv.apply(h, d[:, 0], 0)), d[:, 1], 1)
        return self.norm(x)

    def propose(self, hidden, lm_head, anchor):
        """hidden [D, H] (block positions 1..B-1), lm_head [V, H]. Returns (unary logits [D, V],
        candidates [D, K], walk scores [D, K], walk tokens [D])."""
        f, sel = self.f, self.candidate_selector
        unary = hidden @ lm_head.T * f["output_multiplier"]
        if f["final_logit_softcapping"] > 0:
            cap = f["final_logit_softcapping"]
            unary = torch.tanh(unary / cap) * cap
        vals, ids = torch.topk(unary, f["selector_top_k"], dim=-1)
        h = sel.hidden_projection(hidden)  # [D, R]
        prev_tok, rows, toks = anchor, [], []
        for k in range(hidden.shape[0]):
            # edge(prev -> c) = <pred[prev] * h_k, succ[c]> + unary[c]
            score = vals[k] + (sel.predecessor_codebook[prev_tok] * h[k]) @ sel.successor_codebook[ids[k]].T
            best = int(torch.argmax(score))  # first maximum: the lowest candidate index
            rows.append(score)
            prev_tok = int(ids[k, best])
            toks.append(prev_tok)
        return unary, ids, torch.stack(rows), torch.tensor(toks)


def load_drafter(d):
    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    m = DFlash2DraftModel(cfg)
    missing, unexpected = m.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=False)
    if missing or unexpected:
        raise SystemExit(f"{d}: missing {missing}, unexpected {unexpected}")
    return m.float().eval()


def parse_ids(s):
    return [int(x) for x in re.split(r"[,\s]+", s.strip()) if x]


@torch.no_grad()
def main():
    from transformers import AutoModelForCausalLM
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32, attn_implementation="eager").eval()
    dr = load_drafter(args.drafter)
    B = args.block_size or dr.f["block_size"]
    layers = dr.f["target_layer_ids"]
    emb, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    prompt = parse_ids(args.ids)
    seq = list(prompt)

    def run_target(ids):
        out = target(torch.tensor([ids]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[k + 1][0] for k in layers], -1)
        return out.logits[0], feats

    logits, feats = run_target(seq)
    anchor = int(logits[-1].argmax())
    rec = {}
    for r in range(args.rounds):
        start = len(seq)
        block = torch.tensor([anchor] + [dr.f["mask_token_id"]] * (B - 1))
        h = dr.hidden(feats[:start], emb[block])
        unary, cand, scores, toks = dr.propose(h[1:], head, anchor)
        rows = torch.full_like(unary, float("-inf"))
        rows.scatter_(1, cand, scores)
        verify, feats = run_target(seq + [anchor] + toks.tolist())
        pred = verify[start:start + B].argmax(-1)
        a = 0
        while a < B - 1 and int(toks[a]) == int(pred[a]):
            a += 1
        rec[f"draft_logits.{r}"] = rows.contiguous()
        rec[f"unary.{r}"] = unary.contiguous()
        rec[f"candidates.{r}"] = cand.long().contiguous()
        rec[f"block_ids.{r}"] = torch.cat([block[:1], toks]).long()
        rec[f"start.{r}"] = torch.tensor([start])
        rec[f"accepted.{r}"] = torch.tensor([a])
        seq += [anchor] + toks[:a].tolist()
        anchor = int(pred[a])
    rec["output_ids"] = torch.tensor(seq[len(prompt):] + [anchor])
    save_file(rec, args.out)
    print(json.dumps({"out": args.out, "rounds": args.rounds, "block_size": B,
                      "accepted": [int(rec[f"accepted.{r}"][0]) for r in range(args.rounds)],
                      "output_ids": rec["output_ids"].tolist()}))


if __name__ == "__main__":
    main()
