"""dfl eval --train-metrics as a run (docs/train-vs-serve.md): batched drafts give the same counts
as one block at a time; --train-attn scores sliding-layer drafters under the other block attention
and --block-attn sets it (reported in summary.md, summary.json and run.json); --train-chat scores
the responses after prompts in another template; the Features check names a pipeline's features
that are dfl's rounded to bf16, hooked one layer early, or the last layer after the final norm;
options that cannot work together are refused. The embedded pair and the sliding-window fixture."""
import json
import os
import shutil
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from dfltest import DATA, SOURCE, Tally, dfl, fixture

T = Tally("test_train_eval")
TMP = tempfile.mkdtemp(prefix="dfl_train_eval_")
TARGET = os.path.join(SOURCE, "models", "target")
DRAFTER = os.path.join(SOURCE, "models", "drafter")
PROMPTS = os.path.join(TMP, "gsm3.jsonl")
with open(os.path.join(DATA, "datasets", "gsm8k", "train.jsonl")) as f, open(PROMPTS, "w") as g:
    for _ in range(3):
        g.write(f.readline())


def rows(out):
    with open(os.path.join(out, "train.jsonl")) as f:
        return [json.loads(x) for x in f]


def counts(r):
    return {k: r[k] for k in ("prompt_id", "labels", "features", "attn", "random_anchors", "random", "all", "walk")}


def batching():
    outs = []
    for nb in (1, 32):
        out = os.path.join(TMP, f"batch{nb}")
        dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--format", "gsm8k",
            "--max-new", "64", "--train-metrics", "--train-batch", nb, "--cost-reps", "0", "--out", out)
        outs.append(sorted((counts(r) for r in rows(out)), key=json.dumps))
    T.check(len(outs[0]) == 6, f"3 prompts x (target, dataset) rows, found {len(outs[0])}")
    T.check(outs[0] == outs[1], "32 blocks per drafter forward give the counts of one block at a time, exactly")
    s = json.load(open(os.path.join(TMP, "batch32", "summary.json")))
    tv = s["train_vs_serve"]["drafters"][0]
    T.check([w["factor"] for w in tv["waterfall"]][:2] == ["", "labels: dataset -> target greedy"],
            f"the waterfall starts from the dataset labels: {tv['waterfall']}")
    T.check(abs(tv["serving_chain_tau"] - tv["waterfall"][-1]["value"]) < 1e-9, "the waterfall ends at the replay's tau")
    md = open(os.path.join(TMP, "batch32", "summary.md")).read()
    T.check("## Training vs serving" in md and "What moved tau most" in md, "summary.md has the section and its verdict")
    T.check(os.path.getsize(os.path.join(TMP, "batch32", "train_vs_serve.svg")) > 500, "train_vs_serve.svg written")


def block_attention():
    target, drafter = fixture("qwen3_tiny"), fixture("dflash_qwen3_sliding")
    out = os.path.join(TMP, "attn")
    dfl("eval", "--target", target, "--drafter", drafter, "--prompts", PROMPTS, "--format", "gsm8k", "--max-new", "32",
        "--train-metrics", "--train-attn", "bidirectional", "--cost-reps", "0", "--out", out)
    rs = rows(out)
    alt = [r for r in rs if r["attn"] == "bidirectional"]
    cfg = [r for r in rs if r["attn"] == "config" and r["labels"] == "target"]
    T.check(len(alt) == 3 and len(cfg) == 3, f"a bidirectional row per response: {len(alt)}, {len(cfg)}")
    # a random drafter accepts nothing either way: its distributions (alpha) tell the attentions apart
    diff = sum(abs(a["all"]["alpha"][0] - c["all"]["alpha"][0]) for a, c in zip(alt, cfg))
    T.check(diff > 1e-6, f"the other block attention changes the drafts (alpha difference {diff})")
    s = json.load(open(os.path.join(out, "summary.json")))
    ba = s["run"]["block_attention"][0]["block_attention"]
    T.check(ba["mode"] == "sliding-causal" and ba["sliding_layers"] == 2, f"summary.json says what ran: {ba}")
    md = open(os.path.join(out, "summary.md")).read()
    T.check("with block attention bidirectional" in md and "Block attention (--block-attn)" in md,
            "summary.md has the attention row and says which attention ran")
    out2 = os.path.join(TMP, "attn_bi")
    dfl("eval", "--target", target, "--drafter", drafter, "--prompts", PROMPTS, "--format", "gsm8k", "--max-new", "32",
        "--block-attn", "bidirectional", "--train-metrics", "--cost-reps", "0", "--out", out2)
    s2 = json.load(open(os.path.join(out2, "summary.json")))
    T.check(s2["run"]["block_attention"][0]["block_attention"]["mode"] == "bidirectional",
            "--block-attn bidirectional is what ran")
    T.check(json.load(open(os.path.join(out2, "run.json")))["block_attn"] == "bidirectional", "run.json records it")
    # the bidirectional run's own rows equal the first run's --train-attn rows
    by = {r["prompt_id"]: r for r in rows(out2) if r["labels"] == "target"}
    T.check(all(by[a["prompt_id"]]["all"] == a["all"] for a in alt),
            "--train-attn bidirectional scores as a run with --block-attn bidirectional does")


def template():
    out = os.path.join(TMP, "chat")
    dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--format", "gsm8k", "--max-new", "64",
        "--train-metrics", "--train-chat", "none", "--cost-reps", "0", "--out", out)
    rs = rows(out)
    tpl = [r for r in rs if r["labels"] == "template"]
    tgt = {r["prompt_id"]: r for r in rs if r["labels"] == "target"}
    T.check(len(tpl) == 3, f"a template row per prompt: {len(tpl)}")
    T.check(all(r["tokens"] == tgt[r["prompt_id"]]["tokens"] and r["prompt_tokens"] < tgt[r["prompt_id"]]["prompt_tokens"]
                for r in tpl), "the same response after the shorter untemplated prompt")
    md = open(os.path.join(out, "summary.md")).read()
    T.check("the prompt without a chat template" in md, "the template row is in the waterfall")


def rmsnorm_plus_one(x, w, eps):
    x = torch.from_numpy(x).double()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + torch.from_numpy(w).double())).float().numpy()


def features_check():
    feat, rec = os.path.join(TMP, "feat"), os.path.join(TMP, "rec")
    dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--format", "gsm8k", "--max-new", "48",
        "--train-metrics", "--save-features", feat, "--cost-reps", "0", "--out", rec)
    cfg = json.load(open(os.path.join(TARGET, "config.json")))
    eps = cfg["text_config"]["rms_norm_eps"]
    from safetensors import safe_open
    with safe_open(os.path.join(TARGET, "model.safetensors"), "pt") as f:  # BF16 weights: torch reads them
        w = f.get_tensor("model.language_model.norm.weight").float().numpy()
    mistakes = {
        "bf16": lambda t: {k: (torch.from_numpy(v).to(torch.bfloat16).float().numpy() if k.startswith("layer.") else v)
                           for k, v in t.items()},
        "shift": lambda t: {**t, "layer.6": t["layer.5"]},
        "postnorm": lambda t: {**t, "layer.7": rmsnorm_plus_one(t["layer.7"], w, eps)},
    }
    for name, damage in mistakes.items():
        pipe = os.path.join(TMP, "pipe_" + name)
        os.makedirs(pipe)
        for fn in os.listdir(feat):
            if fn.endswith(".safetensors"):
                t = load_file(os.path.join(feat, fn))
                save_file({k: np.ascontiguousarray(v) for k, v in damage(t).items()
                           if k == "input_ids" or k.startswith("layer.")}, os.path.join(pipe, fn))
        out = os.path.join(TMP, "chk_" + name)
        dfl("eval", "--features", feat, "--features-from", pipe, "--drafter", DRAFTER, "--train-metrics", "--out", out)
        s = json.load(open(os.path.join(out, "summary.json")))
        layers = {x["layer"]: x for x in s["features_check"]["layers"]}
        md = open(os.path.join(out, "summary.md")).read()
        if name == "bf16":
            T.check(all(layers[k]["kind"] == "bf16" for k in (1, 3, 5, 6)), f"bf16 named on every layer: {layers}")
        if name == "shift":
            T.check(layers[6]["kind"] == "shifted" and layers[6]["other"] == 5 and layers[5]["kind"] == "match",
                    f"layer 6 named as dfl's layer 5: {layers[6]}")
            T.check("hooked 1 layer early" in md, "summary.md says hooked one layer early")
        if name == "postnorm":
            T.check(layers[7]["kind"] == "postnorm" and layers[6]["kind"] == "match",
                    f"layer 7 named as after the final norm: {layers[7]}")
        sets = {(x["labels"], x["features"]) for x in s["train_vs_serve"]["drafters"][0]["sets"]}
        T.check(("target", "pipeline") in sets, f"training metrics on the pipeline's features too: {sets}")


def refused():
    for extra, what in ((["--online"], "--online"), (["--train-chat", "chatml"], "the same template"),
                        (["--train-attn", "auto"], "auto")):
        p = dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--format", "gsm8k",
                "--train-metrics", *extra, "--out", os.path.join(TMP, "bad"), check=False)
        T.check(p.returncode != 0 and p.stderr.strip(), f"--train-metrics with {what} is refused: {p.stderr[-300:]}")
    for flag, value in (("--train-batch", "0"), ("--train-anchors", "0"), ("--train-top-k", "0"),
                        ("--train-gamma", "0"), ("--train-chat", "llama"), ("--train-attn", "sideways"),
                        ("--block-attn", "sideways")):
        p = dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--format", "gsm8k",
                "--train-metrics", flag, value, "--out", os.path.join(TMP, "bad"), check=False)
        T.check(p.returncode == 2 and flag in p.stderr, f"{flag} {value}: a usage error naming it: {p.stderr[-300:]}")


for fn in (batching, block_attention, template, features_check, refused):
    T.run(fn)
shutil.rmtree(TMP, ignore_errors=True)
T.done()
