"""A DFlash drafter's attention inside the block (docs/design.md §4, "Block attention") against a
minimal torch reference written from the semantics, not from dfl's code (CPU, float64).

- The reference: SpecForge's create_dflash_sdpa_mask with its sliding-window terms. Query i of the
  block (position anchor + i) sees context keys kv < anchor, in sliding layers only those with
  kv >= anchor + i - (window - 1); and keys of its own block, in causal layers only offsets <= i
  (sliding-causal: the sliding layers; causal: every layer; bidirectional, z-lab's reference:
  none). Everything else is the z-lab DFlashDraftModel forward (fc, hidden_norm, Qwen3 layers with
  q/k norms and RoPE, final norm, the target's embedding and lm_head).
- dfl's draft logits for every --block-attn value (dfl generate --dump-drafts, several rounds,
  a context longer and one shorter than the window) match the reference within 1e-4 relative.
- On dflash_qwen3_sliding (S, F, S, window 10, block 8) bidirectional, sliding-causal and causal
  give different logits (so this test can fail); on dflash_qwen3 (no sliding layers) sliding-causal
  and bidirectional give identical logits, and causal does not.
- Config: is_causal, then dflash_config.causal, else sliding-causal; what each gives equals the
  matching --block-attn; dfl inspect and generate --json report it. Refusals: a non-bool field, a
  bidirectional window smaller than the block (config or --block-attn), an unknown --block-attn,
  --block-attn without a DFlash drafter (none, an MTP head). serve and bench take the flag."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import numpy as np
import torch
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

from dfltest import DFL, Tally, dfl, dfl_json, fixture

t = Tally("block attention")
tmp = tempfile.mkdtemp(prefix="dfl-block-attn-")
TARGET = fixture("qwen3_tiny")
SLIDING, FULL = fixture("dflash_qwen3_sliding"), fixture("dflash_qwen3")
LONG = "5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28"  # 24 > window 10
SHORT = "300,301,302"
MODES = ["auto", "sliding-causal", "bidirectional", "causal"]
torch.set_num_threads(1)
target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
EMBED = target.get_input_embeddings().weight.detach().double()
LM_HEAD = target.get_output_embeddings().weight.detach().double()


# ---- the reference ----

def rmsnorm(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rope(x, pos, theta):  # x [n, heads, hd]: half-split pairs (i, i + hd/2)
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :], torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    rot = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rot * sin


def visible(mode, sliding, window, anchor, B):
    """[B, anchor + B] bool: query i (position anchor + i) sees which of [context ; block]."""
    causal = {"sliding-causal": sliding, "bidirectional": False, "causal": True}[mode]
    m = torch.zeros(B, anchor + B, dtype=torch.bool)
    for i in range(B):
        for kv in range(anchor):  # context: kv < anchor always
            m[i, kv] = not sliding or kv >= anchor + i - (window - 1)
        for j in range(B):  # the block: same block; offsets <= i when causal
            m[i, anchor + j] = (not causal or j <= i) and (not sliding or j >= i - (window - 1))
    return m


class Drafter:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as f:
            self.c = json.load(f)
        self.w = {k: torch.from_numpy(v).double() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
        dc = self.c.get("dflash_config") or {}
        self.ids = dc.get("target_layer_ids", self.c.get("target_layer_ids"))
        self.mask = dc.get("mask_token_id", self.c.get("mask_token_id"))
        self.types = self.c.get("layer_types") or ["full_attention"] * self.c["num_hidden_layers"]

    def logits(self, feat, anchor_tok, start, B, mode):
        """Draft logits [B-1, V] of block [anchor, MASK x (B-1)] at positions start.. over features [start, k*H]."""
        c, w, eps = self.c, self.w, self.c["rms_norm_eps"]
        Hq, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        theta = c["rope_parameters"]["rope_theta"]
        ctx = rmsnorm(feat @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
        x = EMBED[[anchor_tok] + [self.mask] * (B - 1)].clone()
        pos = torch.arange(start + B)
        for li, lt in enumerate(self.types):
            p = f"layers.{li}."
            xn = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
            q = rmsnorm((xn @ w[p + "self_attn.q_proj.weight"].T).view(B, Hq, hd), w[p + "self_attn.q_norm.weight"], eps)
            kv_in = torch.cat([ctx, xn])
            k = rmsnorm((kv_in @ w[p + "self_attn.k_proj.weight"].T).view(-1, Hkv, hd), w[p + "self_attn.k_norm.weight"],
                        eps)
            v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(-1, Hkv, hd)
            q, k = rope(q, pos[start:], theta), rope(k, pos, theta)
            k, v = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
            s = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
            s = s.masked_fill(~visible(mode, lt == "sliding_attention", c.get("sliding_window"), start, B)[None],
                              float("-inf"))
            o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(B, Hq * hd)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            xn = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
            g, u = xn @ w[p + "mlp.gate_proj.weight"].T, xn @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        return rmsnorm(x[1:], w["norm.weight"], eps) @ LM_HEAD.T


def features(tokens, layer_ids):
    """The target's outputs of decoder layers layer_ids over tokens, concatenated: [T, k*H]."""
    with torch.no_grad():
        hs = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1][0] for i in layer_ids], -1).double()


# ---- dfl ----

def drafts(drafter, ids, mode=None, max_new=6, extra=()):
    """dfl generate's rounds: (prompt + generated tokens, [(start, block ids, logits [B-1, V])], stats)."""
    out = os.path.join(tmp, f"d-{os.path.basename(drafter)}-{mode}-{len(ids)}-{time.monotonic_ns()}.safetensors")
    j = dfl_json("generate", "--target", TARGET, "--drafter", drafter, "--prompt-ids", ids, "--max-new", max_new,
                 "--ignore-eos", "--json", "--dump-drafts", out, *(["--block-attn", mode] if mode else []), *extra)
    m = load_file(out)
    n = sum(1 for k in m if k.startswith("draft_logits."))
    rounds = [(int(m[f"start.{r}"][0]), m[f"block_ids.{r}"], m[f"draft_logits.{r}"]) for r in range(n)]
    return [int(x) for x in ids.split(",")] + j["tokens"], rounds, j["stats"]


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def against_reference(drafter, ids):
    ref = Drafter(drafter)
    base = None
    for mode in MODES:
        tokens, rounds, stats = drafts(drafter, ids, mode)
        want = "sliding-causal" if mode == "auto" else mode
        t.check(stats["block_attention"]["mode"] == want and
                stats["block_attention"]["source"] == ("default" if mode == "auto" else "override"),
                f"{drafter} {mode}: generate --json block_attention {stats['block_attention']}")
        feat = features(tokens, ref.ids)
        worst = 0.0
        for start, block, lg in rounds:
            t.check(int(block[0]) == tokens[start], f"{mode}: anchor of round at {start}")
            worst = max(worst, rel(lg, ref.logits(feat[:start], tokens[start], start, len(block), want).numpy()))
        t.check(len(rounds) >= 3 and worst < 1e-4,
                f"{os.path.basename(drafter)} {mode} prompt {len(ids.split(','))} tokens: {len(rounds)} rounds, "
                f"draft logits rel err {worst:.3g} vs the reference")
        print(f"{os.path.basename(drafter)} --block-attn {mode}, {len(ids.split(','))}-token prompt: {len(rounds)} "
              f"rounds match the reference (max rel err {worst:.2g})", flush=True)
        if mode == "sliding-causal":
            base = rounds
        elif mode != "auto":
            d = max(rel(a[2], b[2]) for a, b in zip(rounds, base))
            if os.path.basename(drafter) == "dflash_qwen3" and mode == "bidirectional":
                t.check(all(np.array_equal(a[2], b[2]) for a, b in zip(rounds, base)),
                        f"no sliding layers: bidirectional == sliding-causal (max rel diff {d:.3g})")
            else:
                t.check(d > 1e-2, f"{os.path.basename(drafter)}: {mode} differs from sliding-causal (rel {d:.3g})")


def bidirectional_vs_causal():
    a = drafts(SLIDING, LONG, "bidirectional")[1]
    b = drafts(SLIDING, LONG, "causal")[1]
    d = max(rel(x[2], y[2]) for x, y in zip(a, b))
    t.check(d > 1e-2, f"sliding fixture: bidirectional vs causal rel diff {d:.3g}")


# ---- the config, reports, refusals ----

def edited(name, edit, src=SLIDING):
    d = os.path.join(tmp, name)
    shutil.copytree(src, d)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    edit(c)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    return d


def config_fields():
    def dc(v):
        return lambda c: c["dflash_config"].__setitem__("causal", v)

    def both(c):
        c["is_causal"] = True
        c["dflash_config"]["causal"] = False

    cases = [("is_causal", lambda c: c.__setitem__("is_causal", False), "bidirectional", "is_causal"),
             ("dflash_config", dc(True), "causal", "dflash_config.causal"),
             ("both", both, "causal", "is_causal"),
             ("null", lambda c: c.__setitem__("is_causal", None), "sliding-causal", "default")]
    for name, edit, mode, source in cases:
        d = edited(f"cfg-{name}", edit)
        j = dfl_json("inspect", d, "--json")["block_attention"]
        t.check(j["mode"] == mode and j["source"] == source and j["sliding_layers"] == 2 and j["sliding_window"] == 10,
                f"{name}: inspect --json block_attention {j}")
        txt = dfl("inspect", d).stdout
        t.check(f"[mode {mode}]" in txt and (source == "default" or f"config {source} = " in txt),
                f"{name}: inspect text: {[x for x in txt.splitlines() if 'block attn' in x]}")
        mine = drafts(d, LONG, max_new=4)[1]
        same = drafts(SLIDING, LONG, mode, max_new=4)[1]
        t.check(all(np.array_equal(a[2], b[2]) for a, b in zip(mine, same)),
                f"{name}: the config's {mode} drafts as --block-attn {mode}")
    # an override on top of the config's, and back
    d = os.path.join(tmp, "cfg-is_causal")
    over = drafts(d, LONG, "sliding-causal", max_new=4)
    t.check(all(np.array_equal(a[2], b[2]) for a, b in zip(over[1], drafts(SLIDING, LONG, max_new=4)[1])) and
            over[2]["block_attention"]["config"] == "bidirectional" and
            over[2]["block_attention"]["source"] == "override",
            f"--block-attn sliding-causal over is_causal false: {over[2]['block_attention']}")
    t.check(dfl_json("inspect", FULL, "--json")["block_attention"]["effective"] == "bidirectional",
            "no sliding layers: sliding-causal is effectively bidirectional")


def refused(args, rc, want):
    p = dfl(*args, check=False)
    t.check(p.returncode == rc and want in p.stderr and "Sanitizer" not in p.stderr,
            f"{args[:1]} {args[-2:]}: rc {p.returncode}, stderr {p.stderr.strip()[:300]!r} lacks {want!r}")


def refusals():
    gen = ["generate", "--target", TARGET, "--prompt-ids", SHORT, "--max-new", 2]
    bad_bool = edited("bad-is_causal", lambda c: c.__setitem__("is_causal", "no"))
    refused(gen + ["--drafter", bad_bool], 1, "'is_causal' must be true or false")
    refused(["inspect", bad_bool], 1, "'is_causal' must be true or false")
    bad_dc = edited("bad-dflash_config", lambda c: c["dflash_config"].__setitem__("causal", 1))
    refused(gen + ["--drafter", bad_dc], 1, "dflash_config: field 'causal' must be true or false")

    def narrow(c):
        c["is_causal"] = False
        c["sliding_window"] = 4
    refused(gen + ["--drafter", edited("bad-window", narrow)], 1,
            "sliding_window 4 is smaller than block_size 8 in a non-causal (is_causal false) sliding_attention layer 0")
    narrow_default = edited("narrow-default", lambda c: c.__setitem__("sliding_window", 4))
    refused(gen + ["--drafter", narrow_default, "--block-attn", "bidirectional"], 1,
            "bidirectional block attention: sliding_window 4 is smaller than block_size 8 in sliding_attention layer 0")
    t.check(dfl(*gen, "--drafter", narrow_default, "--block-attn", "causal", check=False).returncode == 0,
            "a window smaller than the block runs causally")
    refused(gen + ["--drafter", SLIDING, "--block-attn", "full"], 2,
            "--block-attn: expected auto, sliding-causal, bidirectional or causal, found 'full'")
    refused(gen + ["--block-attn", "causal"], 2, "--block-attn needs --drafter")
    refused(["generate", "--target", fixture("qwen35_mtp"), "--drafter", "mtp", "--prompt-ids", SHORT,
             "--block-attn", "bidirectional"], 1, "an MTP head drafts one token at a time and has no block attention")
    t.check(dfl("generate", "--target", fixture("qwen35_mtp"), "--drafter", "mtp", "--prompt-ids", SHORT,
                "--max-new", 2, "--block-attn", "auto", check=False).returncode == 0, "MTP with --block-attn auto runs")
    refused(["serve", "--target", TARGET, "--block-attn", "sideways"], 2, "found 'sideways'")
    refused(["serve", "--target", TARGET, "--block-attn", "causal"], 2, "--block-attn needs --drafter")
    refused(["bench", "--model", TARGET, "--drafter", "none", "--parts", "decode", "--block-attn", "causal"], 2,
            "--block-attn needs a drafter")
    for cmd in ("generate", "serve", "bench"):
        t.check("--block-attn MODE" in dfl(cmd, "--help").stdout and "sliding-causal" in dfl(cmd, "--help").stdout,
                f"{cmd} --help names --block-attn")


def bench_and_serve():
    j = dfl_json("bench", "--model", TARGET, "--drafter", SLIDING, "--parts", "draft", "--context", 16, "--reps", 1,
                 "--json", "--block-attn", "bidirectional")
    t.check(j["drafter"]["block_attention"]["mode"] == "bidirectional", f"bench --json drafter: {j.get('drafter')}")
    p = subprocess.Popen([DFL, "serve", "--target", TARGET, "--drafter", SLIDING, "--port", "0", "--quiet",
                          "--block-attn", "causal"], stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            if re.search(r"listening on", line):
                break
    finally:
        p.terminate()
        p.wait(timeout=60)
    t.check(any("drafter block attention: causal in every layer; set at run time" in x for x in lines) and
            "listening on" in lines[-1], f"serve names the block attention: {lines}")


for ids in (LONG, SHORT):
    t.run(against_reference, SLIDING, ids)
t.run(against_reference, FULL, LONG)
t.run(bidirectional_vs_causal)
t.run(config_fields)
t.run(refusals)
t.run(bench_and_serve)
t.done()
