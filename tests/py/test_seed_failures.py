"""Seeded pipeline failures (tools/pipeline_features.py --mistake) and what `dfl eval --features FEAT
--features-from PIPE --train-metrics` reports about them, on the embedded pair (4 GSM8K prompts, 128
tokens, features recorded with --save-features --save-layers 7 --train-metrics):
- the files: off-by-one's layer k is the correct pipeline's layer k - 1; post-norm changes only the
  target's last layer (7), to its final norm; bf16 stores BF16 tensors;
- summary.json's train_vs_serve has the pipeline's rows (features "pipeline") next to dfl's for every
  drafter, and summary.md the pipeline's lines in the waterfall;
- the embedded drafter reads target layers [1, 3, 5, 6]: a correct transformers pipeline, and bf16,
  give its chain tau within 2%; off-by-one (layers [0, 2, 4, 5]) is clearly below (at least 8%), and
  the training metrics on the pipeline's features fall with it; post-norm leaves it unchanged (it
  reads no last layer). A variant of it reading [1, 3, 5, 7] (same weights; on dfl's features it
  keeps its tau) is where post-norm bites: the last layer after the final norm puts it clearly below.
Each case prints the taus (the numbers in the lead's report)."""
import json
import os
import shutil
import sys
import tempfile
import time

import torch
from safetensors import safe_open

from dfltest import DFL, PY, SOURCE, Tally, run

sys.path.insert(0, os.path.join(SOURCE, "tools"))
import pipeline_features as PF  # noqa: E402

torch.set_num_threads(1)
t = Tally("seed failures")
tmp = tempfile.mkdtemp(prefix="dfl-seed-failures-")
ET, ED = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
PROMPTS = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
ENV = dict(os.environ, OMP_NUM_THREADS="1")
FEAT = os.path.join(tmp, "feat")
LAST = os.path.join(tmp, "drafter-reads-last")  # the embedded drafter reading target layers [1, 3, 5, 7]


def dfl_eval(*args):
    return run([DFL, "eval", "--progress", "none", *map(str, args)], env=ENV)


def tensors(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def record():
    dfl_eval("--target", ET, "--drafter", ED, "--prompts", PROMPTS, "--format", "gsm8k", "--limit", 4, "--max-new",
             128, "--save-features", FEAT, "--save-layers", 7, "--train-metrics", "--out", os.path.join(tmp, "rec"))
    layers = json.load(open(os.path.join(FEAT, "target.json")))["layers"]
    t.check(7 in layers, f"--save-layers 7: the target's last layer captured ({layers})")
    os.makedirs(LAST)
    shutil.copy(os.path.join(ED, "model.safetensors"), LAST)
    cfg = json.load(open(os.path.join(ED, "config.json")))
    cfg["dflash_config"]["target_layer_ids"] = [1, 3, 5, 7]
    json.dump(cfg, open(os.path.join(LAST, "config.json"), "w"), indent=1)
    return layers


def pipelines(layers):
    """PIPE dirs: correct, off-by-one, bf16 written in-process (one model load per dtype), post-norm by
    the command line. Returns {mistake: dir}."""
    dirs = {m: os.path.join(tmp, f"pipe-{m}") for m in ("none", "off-by-one", "post-norm", "bf16")}
    f32 = PF.load(ET, torch.float32)
    PF.write_dir(f32, FEAT, dirs["none"], layers)
    PF.write_dir(f32, FEAT, dirs["off-by-one"], layers, "off-by-one")
    PF.write_dir(PF.load(ET, torch.bfloat16), FEAT, dirs["bf16"], layers, "bf16")
    p = run([PY, os.path.join(SOURCE, "tools", "pipeline_features.py"), FEAT, dirs["post-norm"], "--mistake",
             "post-norm"], env=ENV)
    t.check("layer 7 after the final norm" in p.stdout, f"post-norm names the layer it changed: {p.stdout.strip()}")
    name = sorted(x for x in os.listdir(dirs["none"]) if x.endswith(".safetensors"))[0]
    ok, obo, pn, bf = (tensors(os.path.join(dirs[m], name)) for m in ("none", "off-by-one", "post-norm", "bf16"))
    saved = tensors(os.path.join(FEAT, name))
    t.check(all(float((ok[f"layer.{k}"] - saved[f"layer.{k}"]).abs().max()) < 1e-4 * float(saved[f"layer.{k}"].abs().max())
                for k in layers), "the correct pipeline's features equal dfl's (float32 noise)")
    t.check(torch.equal(obo["layer.6"], ok["layer.5"]) and torch.equal(obo["layer.1"], PF.layer_features(
        f32, ok["input_ids"], [0])[0]), "off-by-one: layer k holds layer k-1's output")
    with torch.no_grad():
        normed = f32.model.norm(ok["layer.7"])
    t.check(all(torch.equal(pn[f"layer.{k}"], ok[f"layer.{k}"]) for k in layers if k != 7) and
            float((pn["layer.7"] - normed).abs().max()) < 1e-5 and
            not torch.allclose(pn["layer.7"], ok["layer.7"]), "post-norm: only layer 7 changed, to its final norm")
    t.check(all(bf[f"layer.{k}"].dtype == torch.bfloat16 for k in layers), "bf16: BF16 tensors")
    return dirs


def replay(mistake, pipe):
    out = os.path.join(tmp, f"eval-{mistake}")
    dfl_eval("--features", FEAT, "--features-from", pipe, "--train-metrics", "--drafter", ED, "--drafter", LAST,
             "--out", out)
    s = json.load(open(os.path.join(out, "summary.json")))
    md = open(os.path.join(out, "summary.md")).read()
    t.check("*with the pipeline's features:* the replay's chain tau" in md, f"{mistake}: summary.md's waterfall "
                                                                            "has the pipeline's line")
    got = {}
    for d in s["train_vs_serve"]["drafters"]:
        sets = {(x["labels"], x["features"]): x for x in d["sets"]}
        t.check(("target", "pipeline") in sets and ("target", "dfl") in sets,
                f"{mistake}: {d['drafter']}: train_vs_serve sets {sorted(sets)}")
        got[d["drafter"]] = {"dfl": d["serving_chain_tau"], "pipe": d["serving_chain_tau_pipeline_features"],
                             "acc_dfl": sets[("target", "dfl")]["all_anchors"]["accuracy"],
                             "acc_pipe": sets[("target", "pipeline")]["all_anchors"]["accuracy"],
                             "sim_dfl": sets[("target", "dfl")]["all_anchors"]["simulated_acceptance_length"],
                             "sim_pipe": sets[("target", "pipeline")]["all_anchors"]["simulated_acceptance_length"]}
    return got


def main():
    t0 = time.time()
    layers = record()
    dirs = pipelines(layers)
    res = {m: replay(m, d) for m, d in dirs.items()}
    base = res["none"][ED]["dfl"]
    for m, g in res.items():
        for d, v in g.items():
            name = "embedded drafter [1, 3, 5, 6]" if d == ED else "variant reading [1, 3, 5, 7]"
            print(f"{m:11s} {name:30s} chain tau (token-weighted) dfl {v['dfl']:.3f} pipeline {v['pipe']:.3f} "
                  f"({(v['pipe'] / v['dfl'] - 1) * 100:+.1f}%); all-anchor accuracy {v['acc_dfl']:.3f} -> "
                  f"{v['acc_pipe']:.3f}, simulated acceptance {v['sim_dfl']:.3f} -> {v['sim_pipe']:.3f}")
            t.check(abs(v["dfl"] - (base if d == ED else res["none"][LAST]["dfl"])) < 1e-9,
                    f"{m}: {name}: dfl's own tau does not depend on the pipeline")

    def near(m, d):
        v = res[m][d]
        t.check(abs(v["pipe"] / v["dfl"] - 1) <= 0.02, f"{m}: {d}: pipeline tau {v['pipe']:.3f} not within 2% of "
                                                        f"dfl's {v['dfl']:.3f}")

    def below(m, d, frac):
        v = res[m][d]
        t.check(v["pipe"] <= (1 - frac) * v["dfl"] and v["acc_pipe"] < v["acc_dfl"] and v["sim_pipe"] < v["sim_dfl"],
                f"{m}: {d}: pipeline tau {v['pipe']:.3f} (accuracy {v['acc_pipe']:.3f}) not clearly below dfl's "
                f"{v['dfl']:.3f} ({v['acc_dfl']:.3f})")
    near("none", ED), near("none", LAST)
    near("bf16", ED), near("bf16", LAST)
    below("off-by-one", ED, 0.08)
    t.check(res["off-by-one"][LAST]["pipe"] < res["off-by-one"][LAST]["dfl"], "off-by-one: the variant falls too")
    t.check(res["post-norm"][ED]["pipe"] == res["none"][ED]["pipe"], "post-norm: the embedded drafter (no layer 7) "
                                                                     "gets the correct pipeline's tau")
    below("post-norm", LAST, 0.05)
    t.check(abs(res["none"][LAST]["dfl"] / base - 1) <= 0.05, f"the variant keeps about the drafter's tau on dfl's "
                                                              f"features ({res['none'][LAST]['dfl']:.3f} vs {base:.3f})")
    print(f"seed failures: {time.time() - t0:.1f} s")


t.run(main)
t.done()
