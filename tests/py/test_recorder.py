"""The transformers recorder of the Python package (python/dflash_eval/recorder.py, docs/python.md
"Recording with transformers"): on the embedded pair in float32 on the CPU its features directory
replays like dfl's own recording. Checked: the same target identity (config and weights hashes the
Python side computes as dfl does), the same manifest (prompt ids, hashes, lengths), identical prompt
ids, truth tokens and continuation past the eos in every file; the feature differences per layer
are reported (max relative error) and must be float32 rounding; both directories replayed with
`dfl eval --features` give the same tau and the same acceptance per round (equal, or — a near-tie
in the drafter flipped by those differences — within one response's rounds, said so); the replay's
summary names the recorder that produced the truths; two-turn prompts (MT-Bench) get dfl's
second-turn prompt ids; bad inputs raise RecordError. The recorder needs no libdfl.so (it asks the
dfl executable for prompts and the checkpoint's description): loaded here from the source tree."""
import importlib.util
import json
import os
import shutil
import tempfile
import time

import torch
from safetensors import safe_open

from dfltest import DATA, DFL, SOURCE, Tally, dfl

torch.set_num_threads(1)
t = Tally("recorder")
tmp = tempfile.mkdtemp(prefix="dfl-recorder-")
TARGET, DRAFTER = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
GSM8K, MTBENCH = os.path.join(DATA, "gsm8k_test_40.jsonl"), os.path.join(DATA, "datasets", "mt_bench", "question.jsonl")

spec = importlib.util.spec_from_file_location("dflash_eval_recorder",
                                              os.path.join(SOURCE, "python", "dflash_eval", "recorder.py"))
rec = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rec)


def read_dir(d):
    with open(os.path.join(d, "manifest.jsonl")) as f:
        man = [json.loads(x) for x in f if x.strip()]
    files = {}
    for u in man:
        with safe_open(os.path.join(d, u["file"]), "pt") as f:
            files[u["file"]] = ({k: f.get_tensor(k) for k in f.keys()}, f.metadata())
    return man, files, json.load(open(os.path.join(d, "target.json")))


def replay(feat, name, budgets="0,8"):
    out = os.path.join(tmp, name)
    dfl("eval", "--features", feat, "--drafter", DRAFTER, "--tree-budget", budgets, "--out", out)
    s = json.load(open(os.path.join(out, "summary.json")))
    with open(os.path.join(out, "results.jsonl")) as f:
        res = [json.loads(x) for x in f if x.strip()]
    return s, res, open(os.path.join(out, "summary.md")).read()


def compare_dirs(label, a_dir, b_dir):
    """dfl's recording a vs the recorder's b: identity, manifest, tokens; the feature differences."""
    man_a, fa, ta = read_dir(a_dir)
    man_b, fb, tb = read_dir(b_dir)
    for k in ("format", "target", "config_hash", "weights_hash", "layout", "dtype", "layers", "max_new"):
        t.check(ta[k] == tb[k], f"{label}: target.json {k}: dfl {ta[k]!r}, recorder {tb[k]!r}")
    t.check(ta["recorder"] == "dfl" and tb["recorder"].startswith("transformers "),
            f"{label}: target.json recorder: dfl's {ta.get('recorder')!r}, the recorder's {tb.get('recorder')!r}")
    t.check(tb["complete"] is True and tb["costs"]["measured"] is False, f"{label}: complete, no costs measured")
    t.check(man_a == man_b, f"{label}: manifests differ:\n{man_a}\n{man_b}")
    worst = {}
    for name, (xa, ma) in fa.items():
        if name not in fb:
            t.check(False, f"{label}: {name} missing from the recorder's directory")
            continue
        xb, mb = fb[name]
        for k in ("input_ids", "truth_ids"):
            t.check(torch.equal(xa[k], xb[k]), f"{label} {name}: {k} differ: dfl {xa[k].tolist()}, "
                                                 f"recorder {xb[k].tolist()}")
        for k in ("prompt_id", "turn", "prompt_tokens", "tokens", "extended", "stop", "max_new", "target",
                  "target_config_hash", "target_weights_hash", "target_layout", "target_dtype", "act"):
            t.check(ma.get(k) == mb.get(k),
                    f"{label} {name}: __metadata__ {k}: dfl {ma.get(k)!r}, recorder {mb.get(k)!r}")
        t.check(mb.get("recorder") == tb["recorder"], f"{label} {name}: __metadata__ recorder {mb.get('recorder')!r}")
        t.check(set(xa) == set(xb), f"{label} {name}: tensors {sorted(xa)} vs {sorted(xb)}")
        for k in sorted(x for x in xa if x.startswith("layer.")):
            if k not in xb or xa[k].shape != xb[k].shape:
                t.check(False, f"{label} {name}: {k} shape {tuple(xa[k].shape)} vs "
                               f"{tuple(xb[k].shape) if k in xb else None}")
                continue
            d = (xa[k] - xb[k]).float()
            rel = float(d.norm() / xa[k].float().norm())
            row = float((d.norm(dim=1) / xa[k].float().norm(dim=1).clamp_min(1e-30)).max())
            w = worst.setdefault(k, [0.0, 0.0, 0.0])
            w[0], w[1], w[2] = max(w[0], rel), max(w[1], row), max(w[2], float(d.abs().max()))
    for k in sorted(worst, key=lambda x: int(x.split(".")[1])):
        rel, row, mx = worst[k]
        print(f"[{label}] {k}: relative error (Frobenius, worst file) {rel:.2e}, worst position {row:.2e}, "
              f"max |diff| {mx:.2e}")
        t.check(rel < 1e-5, f"{label} {k}: relative error {rel:.2e}: more than float32 rounding")
    return worst


def compare_replays(label, a_dir, b_dir):
    sa, ra, mda = replay(a_dir, f"{label}-replay-dfl")
    sb, rb, mdb = replay(b_dir, f"{label}-replay-recorder")
    t.check(sa["run"].get("truth_recorder") == "dfl",
            f"{label}: dfl's replay truth_recorder {sa['run'].get('truth_recorder')!r}")
    want = json.load(open(os.path.join(b_dir, "target.json")))["recorder"]
    t.check(sb["run"].get("truth_recorder") == want, f"{label}: recorder replay truth_recorder "
                                                     f"{sb['run'].get('truth_recorder')!r}, target.json says {want!r}")
    t.check(f"Truths recorded by {want}" in mdb and "no modeled speedup" in mdb,
            f"{label}: summary.md names the recorder")
    t.check("Truths recorded by dfl" in mda, f"{label}: dfl's summary.md names dfl")
    t.check(sb["costs"]["measured"] is False and all(r.get("speedup_modeled") is None for r in sb["results"]),
            f"{label}: no modeled speedup without measured costs")
    key = lambda r: (r["prompt_id"], r["turn"], r["mode"])  # noqa: E731
    ia, ib = {key(r): r for r in ra}, {key(r): r for r in rb}
    t.check(set(ia) == set(ib), f"{label}: results of other responses: {sorted(ia)} vs {sorted(ib)}")
    differ = [k for k in ia if k in ib and ia[k]["round_lengths"] != ib[k]["round_lengths"]]
    for x, y in zip(sa["results"], sb["results"]):
        print(f"[{label}] {x['mode']}: tau dfl-recorded {x['tau']:.6f}, transformers-recorded {y['tau']:.6f}")
        if differ:
            t.check(abs(x["tau"] - y["tau"]) < 0.1 * x["tau"], f"{label} {x['mode']}: tau {x['tau']} vs {y['tau']}")
        else:
            t.check(x["tau"] == y["tau"] and x["mode"] == y["mode"], f"{label}: tau {x} vs {y}")
    if differ:  # a drafter argmax near a tie, flipped by the ~1e-7 feature differences
        print(f"[{label}] acceptance differs in {len(differ)} of {len(ia)} responses x modes: {differ}")
        t.check(len(differ) <= 1,
                f"{label}: acceptance differs in {len(differ)} responses: more than near-ties explain")
    else:
        print(f"[{label}] every round's acceptance identical ({len(ia)} responses x modes)")


def gsm8k():
    feat_dfl, feat_py = os.path.join(tmp, "gsm8k-dfl"), os.path.join(tmp, "gsm8k-py")
    t0 = time.time()
    dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", GSM8K, "--format", "gsm8k", "--limit", 3,
        "--max-new", 64, "--save-features", feat_dfl, "--out", os.path.join(tmp, "gsm8k-dfl-out"))
    t1 = time.time()
    seen = []
    tj = rec.record(TARGET, GSM8K, feat_py, drafter=DRAFTER, device="cpu", dtype="float32", max_new=64,
                    format="gsm8k", limit=3, dfl_bin=DFL, progress=lambda d, n, pid: seen.append((d, n, pid)))
    t2 = time.time()
    print(f"[gsm8k] dfl --save-features {t1 - t0:.1f} s, transformers recorder {t2 - t1:.1f} s ({tj['recorder']})")
    t.check(seen == [(1, 3, "1"), (2, 3, "2"), (3, 3, "3")], f"progress calls {seen}")
    t.check(tj["recorder_settings"]["device"] == "cpu" and tj["recorder_settings"]["dtype"] == "float32",
            f"recorder settings {tj['recorder_settings']}")
    compare_dirs("gsm8k", feat_dfl, feat_py)
    compare_replays("gsm8k", feat_dfl, feat_py)


def two_turns():
    """MT-Bench: the second turn is built by dfl after the model's own (transformers') answer."""
    feat_dfl, feat_py = os.path.join(tmp, "mt-dfl"), os.path.join(tmp, "mt-py")
    dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", MTBENCH, "--limit", 1, "--max-new", 32,
        "--save-features", feat_dfl, "--out", os.path.join(tmp, "mt-dfl-out"))
    rec.record(TARGET, MTBENCH, feat_py, drafter=DRAFTER, max_new=32, limit=1, dfl_bin=DFL)
    man = [json.loads(x) for x in open(os.path.join(feat_py, "manifest.jsonl"))]
    t.check([u["turn"] for u in man] == [0, 1], f"two turns recorded: {man}")
    compare_dirs("mt-bench", feat_dfl, feat_py)


def bad_inputs():
    def refused(what, want, **kw):
        args = dict(target=TARGET, prompts=GSM8K, out_dir=os.path.join(tmp, "bad"), drafter=DRAFTER, limit=1,
                    max_new=8, dfl_bin=DFL)
        args.update(kw)
        try:
            rec.record(args.pop("target"), args.pop("prompts"), args.pop("out_dir"), **args)
        except rec.RecordError as e:
            t.check(want in str(e), f"{what}: message {str(e)!r} lacks {want!r}")
            return
        except Exception as e:  # noqa: BLE001 — any other exception is the failure being tested
            t.check(False, f"{what}: {type(e).__name__} instead of RecordError: {e}")
            return
        t.check(False, f"{what}: no exception")

    empty = os.path.join(tmp, "no-config")
    os.makedirs(empty)
    shutil.copy(os.path.join(TARGET, "model.safetensors"), empty)
    refused("target without config.json", "no config.json", target=empty)
    refused("target not a directory", "not a directory", target=os.path.join(tmp, "missing"))
    refused("layers the model lacks", "decoder layers 0..7", drafter=None, layers=[1, 8])
    refused("negative layer", "decoder layers 0..7", drafter=None, layers=[-1])
    refused("layers and drafter both", "one of the two", layers=[1])
    refused("neither layers nor drafter", "one of the two", drafter=None)
    refused("a dtype", "expected one of float32", dtype="int8")
    refused("a chat template", "expected one of chatml", chat="llama")
    refused("max_new 0", "max_new", max_new=0)
    refused("prompts missing", "no such file", prompts=os.path.join(tmp, "nothing.jsonl"))
    refused("a target as drafter", "not a DFlash drafter", drafter=TARGET)
    # an out_dir that already holds a recording
    refused("recording over a recording", "already lists saved truths", out_dir=os.path.join(tmp, "gsm8k-py"))
    refused("a dfl executable that is not one", "not an executable file", dfl_bin=os.path.join(tmp, "no-dfl"))


t0 = time.time()
for fn in (gsm8k, two_turns, bad_inputs):
    t.run(fn)
print(f"[recorder] {time.time() - t0:.1f} s")
shutil.rmtree(tmp, ignore_errors=True)
t.done()
