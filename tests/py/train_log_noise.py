"""How far dfl's --train-metrics may sit from the embedded drafter's training log for reasons other
than a bug: the measurements behind the tolerances of tests/py/test_train_log.py (recorded in
tests/data/drafter_train_log.json "measured"). Not a test (about 3 minutes on 2 cores):

    OMP_NUM_THREADS=1 .venv/bin/python tests/py/train_log_noise.py [WORKDIR]

1. bf16 features: training read the features stored in bf16, dfl reads float32. The saved features,
   rounded to bf16, replayed as --features-from: per-k accuracy and expected tau against dfl's.
2. float32 vs bf16 weights: training evaluated the float32 drafter, then saved it in BF16. The lost
   residual is not known; three float32 drafters = the BF16 weights + a residual uniform within half a
   bf16 step (what rounding leaves) show how much such a residual moves the figures.
3. anchor sampling: per-anchor correctness of every anchor (tests/py/specforge_ref.py, also checked
   against dfl's "all" counts) and 2000 draws of 64 random anchors per response, pooled per batch of 8
   and averaged over the 6 batches as the training's evaluate() did: the spread of each accuracy and
   of the expected tau."""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dfltest import DATA, DFL, SOURCE, run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specforge_ref as S  # noqa: E402

torch.set_num_threads(1)
LOG = json.load(open(os.path.join(SOURCE, "tests", "data", "drafter_train_log.json")))
ET, ED = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def pooled(rows, s):
    return np.array([sum(r[s]["correct"][k] for r in rows) / sum(r[s]["valid"][k] for r in rows) for k in range(15)])


def etau(acc):
    return 1 + float(np.cumprod(acc).sum())


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dfl-train-log-noise-")
    os.makedirs(work, exist_ok=True)
    h = LOG["heldout"]
    prompts = os.path.join(work, "prompts.jsonl")
    with open(os.path.join(DATA, "datasets", "gsm8k", "train.jsonl")) as f, open(prompts, "w") as o:
        for i, line in enumerate(f, 1):
            if h["first_line"] <= i <= h["last_line"]:
                o.write(json.dumps({"question": json.loads(line)["question"]}) + "\n")
    feat, out = os.path.join(work, "feat"), os.path.join(work, "out")
    run([DFL, "eval", "--target", ET, "--drafter", ED, "--prompts", prompts, "--format", "gsm8k", "--chat", "chatml",
         "--max-new", str(h["max_new"]), "--train-metrics", "--train-anchors", "64", "--save-features", feat, "--out",
         out, "--progress", "none"], env=ENV)
    # 1 + 2: bf16-rounded features, float32 drafters with a plausible residual
    bf = os.path.join(work, "bf16")
    os.makedirs(bf, exist_ok=True)
    for name in os.listdir(feat):
        if name.endswith(".safetensors"):
            d = load_file(os.path.join(feat, name))
            save_file({k: (v.to(torch.bfloat16) if k.startswith("layer.") else v) for k, v in d.items()
                       if k == "input_ids" or k.startswith("layer.")}, os.path.join(bf, name))
    w = load_file(os.path.join(ED, "model.safetensors"))
    drafters = [ED]
    for s in (1, 2, 3):
        g = torch.Generator().manual_seed(s)
        d = os.path.join(work, f"drafter-f32-{s}")
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(ED, "config.json"), d)
        res = {}
        for k, v in w.items():
            x = v.float()
            step = torch.pow(2.0, torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - 7)  # bf16 spacing at x
            res[k] = (x + (torch.rand(x.shape, generator=g) - 0.5) * step).contiguous()
        save_file(res, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        drafters.append(d)
    m1 = os.path.join(work, "sys")
    run([DFL, "eval", "--features", feat, "--features-from", bf, *sum((["--drafter", d] for d in drafters), []),
         "--train-metrics", "--train-anchors", "64", "--out", m1, "--progress", "none"], env=ENV)
    rows = [json.loads(x) for x in open(os.path.join(m1, "train.jsonl"))]
    base = {s: pooled([r for r in rows if r["drafter"] == ED and r["features"] == "dfl"], s) for s in ("random", "all")}
    sys_k, sys_tau = {}, {}
    for d in drafters:
        for f in ("dfl", "pipeline"):
            if d == ED and f == "dfl":
                continue
            what = ("bf16 features" if d == ED else f"float32 residual {os.path.basename(d)}"
                    + (" + bf16 features" if f == "pipeline" else ""))
            for s in ("random", "all"):
                a = pooled([r for r in rows if r["drafter"] == d and r["features"] == f], s)
                dk, dt = float(np.abs(a - base[s]).max()), etau(a) - etau(base[s])
                sys_k[what] = max(sys_k.get(what, 0), dk)
                sys_tau[what] = max(sys_tau.get(what, 0), abs(dt), key=abs)
                print(f"{what:45s} {s:6s} max |d acc_k| {dk:.4f}  d exp tau {dt:+.4f}")
    # 3: anchor sampling, from every anchor's correctness
    ref = S.Reference(ED, ET)
    tr = sorted((json.loads(x) for x in open(os.path.join(out, "train.jsonl"))), key=lambda r: int(r["prompt_id"]))
    tr = [r for r in tr if r["labels"] == "target"]
    man = {m["prompt_id"]: m for m in map(json.loads, open(os.path.join(feat, "manifest.jsonl")))}
    OK, VA, bad = [], [], 0
    for r in tr:
        f = S.read_features(os.path.join(feat, man[r["prompt_id"]]["file"]))
        res = ref.score(f["x"], f["layers"], S.valid_anchors(f["n_prompt"], len(f["x"])))
        c = S.counts(res)
        bad += any(c[k] != r["all"][k] for k in ("anchors", "len_sum", "valid", "correct", "cont", "reach"))
        OK.append(res["ok"].numpy())
        VA.append(res["valid"].numpy())
    print(f"reference vs dfl, every anchor of {len(tr)} responses: {bad} rows differ")
    rng = np.random.default_rng(0)

    def draw():
        accs = []
        for b in range(0, len(OK), 8):
            c, v = np.zeros(15), np.zeros(15)
            for s in range(b, min(b + 8, len(OK))):
                sel = rng.choice(len(OK[s]), min(64, len(OK[s])), replace=False)
                c += OK[s][sel].sum(0)
                v += VA[s][sel].sum(0)
            accs.append(c / v)
        return np.mean(accs, 0)
    D = np.array([draw() for _ in range(2000)])
    E = np.array([etau(a) for a in D])
    print("training estimator over 2000 draws: mean", " ".join(f"{x:.3f}" for x in D.mean(0)), f"exp tau {E.mean():.3f}")
    print("   sd", " ".join(f"{x:.4f}" for x in D.std(0)), f"exp tau sd {E.std():.4f}")
    print(json.dumps({"systematic_acc_k": round(max(sys_k.values()), 4),
                      "systematic_exp_tau": round(max(abs(v) for v in sys_tau.values()), 4),
                      "sampling_sd_acc_k": [round(float(x), 4) for x in D.std(0)],
                      "sampling_sd_exp_tau": round(float(E.std()), 4)}))


if __name__ == "__main__":
    main()
