"""DFlash2 drafters (docs/dflash2.md) against tools/reference/dflash2_reference.py (CPU, float32):

- per round, over several rounds: the proposal's rows (the selector's scores at each position's
  K candidates, -inf elsewhere) within 1e-4 relative, the same candidates, the same selected
  block, the same anchors; dense (z-lab schema, sliding + full layers) and hybrid target
  (speculators schema, 3 taps, output multiplier and softcap), and a block below block_size;
- lossless: greedy speculative output == autoregressive, chain and DDTree, dense and hybrid;
- dfl eval with a DFlash and a DFlash2 drafter in one run: replay statistics equal online ones;
- on the embedded trained pair (models/): DFlash2 drafters made from the DFlash drafter's bf16
  weights; with a neutral conv and selector (identity taps, zero codebooks) greedy chain decoding
  equals the DFlash drafter's round for round; with a perturbed one, agreement with the reference
  over rounds that accept drafts, and lossless chain and DDTree with acceptance well above 1;
- dfl serve with a DFlash2 drafter gives dfl generate's tokens; inspect names it and its fields;
- bad configs and tensors refused with the field or tensor named."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import numpy as np
from safetensors.numpy import load_file

from dfltest import DATA, DFL, PY, SOURCE, Tally, dfl, dfl_json, fixture, run

REF = os.path.join(SOURCE, "tools", "reference", "dflash2_reference.py")
t = Tally("dflash2")
tmp = tempfile.mkdtemp(prefix="dfl-dflash2-")
TINY, VLM = fixture("qwen3_tiny"), fixture("qwen35_vlm")
D2, D2H, D1 = fixture("dflash2_qwen3"), fixture("dflash2_qwen35"), fixture("dflash_qwen3")
PROMPTS = ["11,200,37,512,99,3,641,77,12", "5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28"]
GSM = os.path.join(DATA, "datasets", "gsm8k", "test.jsonl")
ET, ED = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")


def vs_reference(target, drafter, ids, rounds, block=None, accepting=False):
    tag = f"{os.path.basename(drafter)} B={block or 'default'} prompt {len(ids.split(','))}"
    ref = os.path.join(tmp, "ref.safetensors")
    mine = os.path.join(tmp, "dfl.safetensors")
    extra = ["--block-size", str(block)] if block else []
    out = json.loads(run([PY, REF, "--target", target, "--drafter", drafter, "--ids", ids, "--rounds", str(rounds),
                          "--out", ref, *extra]).stdout.strip().splitlines()[-1])
    B = out["block_size"]
    g = dfl_json("generate", "--target", target, "--drafter", drafter, "--prompt-ids", ids, "--max-new",
                 rounds * B + 1, "--ignore-eos", "--json", "--dump-drafts", mine, *extra)
    r, m = load_file(ref), load_file(mine)
    for k in range(rounds):
        a, b = m[f"draft_logits.{k}"], r[f"draft_logits.{k}"]
        fa, fb = np.isfinite(a), np.isfinite(b)
        same = a.shape == b.shape and np.array_equal(fa, fb)
        rel = float(np.abs(a[fa] - b[fb]).max() / np.abs(b[fb]).max()) if same else float("inf")
        t.check(same and rel < 1e-4, f"{tag} round {k}: proposal rows rel err {rel:.3g} (same candidates: {same})")
        t.check(np.array_equal(m[f"block_ids.{k}"], r[f"block_ids.{k}"]) and int(m[f"start.{k}"][0]) ==
                int(r[f"start.{k}"][0]), f"{tag} round {k}: selected block {m[f'block_ids.{k}'].tolist()} vs "
                                         f"reference {r[f'block_ids.{k}'].tolist()}")
    n = len(out["output_ids"])
    t.check(g["tokens"][:n] == out["output_ids"], f"{tag}: committed tokens differ from the reference's loop")
    # the selector's block is its own: not the per-position argmax of the drafter's logits
    walk_differs = any(not np.array_equal(r[f"unary.{k}"].argmax(-1), r[f"block_ids.{k}"][1:]) for k in range(rounds))
    t.check(walk_differs, f"{tag}: the fixture's selector never departs from the per-position argmax")
    if accepting:
        t.check(sum(out["accepted"]) >= rounds, f"{tag}: accepted drafts {out['accepted']}: too few to test")
    print(f"{tag}: {rounds} rounds match the reference", flush=True)


def from_embedded(name, perturb):
    """The embedded DFlash drafter as a DFlash2 drafter: identity taps and zero deltas and codebooks
    (perturb 0: the same block as DFlash), or small random ones."""
    import torch
    from safetensors.torch import load_file as load_pt, save_file as save_pt
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(ED, "config.json")) as f:
        c = json.load(f)
    c["architectures"] = ["DFlash2DraftModel"]
    c["dflash_config"].update(block_size=16, conv_kernel_size=2, conv_group_size=16, selector_rank=16,
                              selector_top_k=8)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    w = load_pt(os.path.join(ED, "model.safetensors"))
    H, V, R, G = c["hidden_size"], c["vocab_size"], 16, c["hidden_size"] // 16
    g = torch.Generator().manual_seed(5)

    def rnd(*shape, std):
        return torch.randn(*shape, generator=g) * std * perturb

    for i in range(c["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            base = rnd(2, 2, H, std=0.05)
            base[:, 0] += 1.0
            w[f"layers.{i}.{conv}.base_kernel"] = base.bfloat16()
            w[f"layers.{i}.{conv}.kernel_projection.weight"] = rnd(2 * 2 * G, H, std=0.05 / H ** 0.5).bfloat16()
    w["candidate_selector.hidden_projection.weight"] = rnd(R, H, std=1 / H ** 0.5).bfloat16()
    w["candidate_selector.predecessor_codebook"] = rnd(V, R, std=0.5).bfloat16()
    w["candidate_selector.successor_codebook"] = rnd(V, R, std=0.5).bfloat16()
    save_pt(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return d


def embedded_ids():
    with open(os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")) as f:
        q = [json.loads(x)["question"] for x in f][:2]
    text = [f"<|im_start|>user\n{x}<|im_end|>\n<|im_start|>assistant\n" for x in q]
    return [",".join(map(str, dfl_json("tokenize", "--tokenizer", ET, "--text", x, "--json"))) for x in text]


def embedded():
    neutral, perturbed = from_embedded("neutral", 0.0), from_embedded("perturbed", 1.0)
    ids = embedded_ids()
    for p in ids:
        run_ = lambda d, *x: dfl_json("generate", "--target", ET, "--drafter", d, "--prompt-ids", p, "--max-new", 64,
                                      "--ignore-eos", "--json", *x)
        a, b = run_(ED), run_(neutral)
        t.check(a["tokens"] == b["tokens"] and a["stats"]["acceptance_lengths"] == b["stats"]["acceptance_lengths"],
                f"neutral DFlash2 != DFlash: {b['stats']['acceptance_lengths']} vs {a['stats']['acceptance_lengths']}")
        greedy = dfl_json("generate", "--target", ET, "--prompt-ids", p, "--max-new", 64, "--ignore-eos",
                          "--json")["tokens"]
        for budget in (0, 16):
            g = run_(perturbed, "--tree-budget", budget)
            t.check(g["tokens"] == greedy and g["stats"]["tau"] > 2,
                    f"perturbed DFlash2, tree budget {budget}: lossless {g['tokens'] == greedy}, tau "
                    f"{g['stats']['tau']}")
        print(f"embedded pair: DFlash tau {a['stats']['tau']:.2f} = neutral DFlash2; perturbed DFlash2 chain tau "
              f"{run_(perturbed)['stats']['tau']:.2f}", flush=True)
    vs_reference(ET, perturbed, ids[0], 4, accepting=True)


def lossless(target, drafter):
    for ids in PROMPTS:
        greedy = dfl_json("generate", "--target", target, "--prompt-ids", ids, "--max-new", 40, "--ignore-eos",
                          "--json")["tokens"]
        for budget in (0, 8, 32):
            g = dfl_json("generate", "--target", target, "--drafter", drafter, "--prompt-ids", ids, "--max-new", 40,
                         "--ignore-eos", "--json", "--tree-budget", budget)
            t.check(g["tokens"] == greedy, f"{os.path.basename(drafter)} tree budget {budget}: speculative != greedy")


def lines(d):
    with open(os.path.join(d, "results.jsonl")) as f:
        return [json.loads(x) for x in f if x.strip()]


def eval_side_by_side():
    common = ["--target", TINY, "--drafter", D1, "--drafter", D2, "--prompts", GSM, "--limit", 2, "--max-new", 24,
              "--tree-budget", "0,8", "--progress", "none"]
    dfl("eval", "--out", os.path.join(tmp, "online"), "--online", *common)
    dfl("eval", "--out", os.path.join(tmp, "replay"), "--check-ar", *common)
    key = ("prompt_id", "turn", "drafter", "mode")
    stats = ("tokens", "rounds", "drafted", "accepted", "accept_hist", "pos_drafted", "pos_accepted", "round_lengths")
    on = {tuple(r[k] for k in key): r for r in lines(os.path.join(tmp, "online")) if r["mode"] != "ar"}
    rp = {tuple(r[k] for k in key): r for r in lines(os.path.join(tmp, "replay"))
          if r["method"] == "replay" and r["mode"] != "ar"}
    t.check(len(on) == 2 * 2 * 2 and set(on) == set(rp), f"eval: rows online {sorted(on)} replay {sorted(rp)}")
    bad = [k for k in on if k in rp and any(on[k][s] != rp[k][s] for s in stats)]
    t.check(not bad, f"eval: replay differs from online for {bad[:2]}")
    t.check({r["drafter"] for r in on.values()} == {D1, D2}, "eval: both drafters in one run")
    summary = open(os.path.join(tmp, "online", "summary.md")).read()
    t.check("dflash2_qwen3" in summary and "dflash_qwen3" in summary, "eval: summary.md names both drafters")


def serve():
    p = subprocess.Popen([DFL, "serve", "--target", TINY, "--drafter", D2, "--port", "0", "--quiet"],
                         stderr=subprocess.PIPE, text=True)
    try:
        port, deadline = None, time.time() + 60
        while time.time() < deadline and port is None:
            line = p.stderr.readline()
            if not line:
                break
            m = re.search(r"listening on http://[^ ]*:(\d+)", line)
            port = int(m.group(1)) if m else None
        t.check(port is not None, "serve with a DFlash2 drafter starts")
        ids = [int(x) for x in PROMPTS[0].split(",")]
        body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                                 "ignore_eos": True}})
        out = run(["curl", "-sS", "--max-time", "120", "-H", "Content-Type: application/json", "--data-binary", body,
                   f"http://127.0.0.1:{port}/generate"]).stdout
        ref = dfl_json("generate", "--target", TINY, "--drafter", D2, "--prompt-ids", PROMPTS[0], "--max-new", 24,
                       "--ignore-eos", "--json")
        r = json.loads(out)
        t.check(r.get("output_ids") == ref["tokens"], f"serve: {r.get('output_ids')} vs generate {ref['tokens']}")
        t.check(r.get("meta_info", {}).get("spec_verify_ct") == ref["stats"]["rounds"], "serve: verification rounds")
    finally:
        p.terminate()
        p.wait(timeout=60)


def inspect():
    j = json.loads(dfl("inspect", D2H, "--json").stdout)
    t.check(j["architecture"] == "dflash2" and j["dflash2"] == {"conv_kernel_size": 3, "conv_group_size": 32,
                                                                 "selector_rank": 16, "selector_top_k": 6,
                                                                 "is_causal": False} and j["tensors"]["other"] == 0,
            f"inspect --json: {j.get('architecture')} {j.get('dflash2')}")
    txt = dfl("inspect", D2, "--target", TINY).stdout
    t.check("drafter (DFlash2" in txt and "selector rank 16 over the top 8" in txt and "compatible" in txt,
            f"inspect text: {txt}")


def bad(name, edit, want, tensors=None):
    """A copy of the dense DFlash2 fixture with its config edited (or a tensor renamed): refused, naming it."""
    d = os.path.join(tmp, f"bad-{name}")
    shutil.copytree(D2, d)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    edit(c)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    if tensors:
        from safetensors.numpy import save_file
        w = load_file(os.path.join(d, "model.safetensors"))
        tensors(w)
        save_file(w, os.path.join(d, "model.safetensors"))
    for cmd in (["inspect", d], ["generate", "--target", TINY, "--drafter", d, "--prompt-ids", "1,2,3",
                                 "--max-new", 4]):
        p = dfl(*cmd, check=False)
        t.check(p.returncode == 1 and want in p.stderr and "Sanitizer" not in p.stderr,
                f"bad {name} ({cmd[0]}): rc {p.returncode}, stderr {p.stderr.strip()[:300]!r} lacks {want!r}")


def bad_configs():
    def drop(field):
        return lambda c: c["dflash_config"].pop(field)

    def setf(field, v):
        return lambda c: c["dflash_config"].__setitem__(field, v)

    for f in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        bad(f"missing-{f}", drop(f), f"needs '{f}'")
    bad("group", setf("conv_group_size", 24), "conv_group_size 24 does not divide hidden_size 64")
    bad("taps", setf("conv_kernel_size", 0), "conv_kernel_size: expected an integer in [1, 8]")
    bad("topk", setf("selector_top_k", 5000), "selector_top_k: expected an integer in [1, 1024]")
    bad("rank", setf("selector_rank", 2.5), "selector_rank: expected an integer")
    bad("causal", lambda c: c.__setitem__("is_causal", "no"), "'is_causal' must be true or false")
    bad("window", lambda c: c.__setitem__("sliding_window", 4), "sliding_window 4 is smaller than block_size 8")
    bad("vocab", lambda c: c.pop("vocab_size"), "needs 'vocab_size'")
    bad("codebook", lambda c: None, "candidate_selector.successor_codebook",
        tensors=lambda w: w.__setitem__("candidate_selector.successor_codebook",
                                        w["candidate_selector.successor_codebook"][:, :8].copy()))
    bad("conv", lambda c: None, "layers.1.mlp_conv.kernel_projection.weight",
        tensors=lambda w: w.pop("layers.1.mlp_conv.kernel_projection.weight"))


for ids in PROMPTS:
    t.run(vs_reference, TINY, D2, ids, 4)
t.run(vs_reference, TINY, D2, PROMPTS[0], 3, 5)
t.run(vs_reference, VLM, D2H, PROMPTS[1], 3)
t.run(vs_reference, VLM, D2H, PROMPTS[0], 2, 6)
t.run(embedded)
t.run(lossless, TINY, D2)
t.run(lossless, VLM, D2H)
t.run(eval_side_by_side)
t.run(serve)
t.run(inspect)
t.run(bad_configs)
t.done()
