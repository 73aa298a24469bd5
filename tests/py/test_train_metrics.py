"""`dfl eval --train-metrics` (src/eval/train_metrics.c) against an independent reference
(tests/py/specforge_ref.py: SpecForge's anchors, dense block mask, accuracy and accepted length in
torch float32 with z-lab's drafter, every anchor of a sequence in one batched forward), on the
embedded trained pair:
- every train.jsonl row ("target" labels on the saved features, "dataset" labels on features of the
  reference answer computed by `dfl hidden`) recomputed on the row's own random_anchors, on every
  anchor and on the serving walk: the integer counts equal (an argmax flip is accepted only as a
  near tie, logit gap < 1e-5, and reported), the float sums within 1e-6 of a reference whose
  softmax rounds as dfl's training metrics do (float32 exp, double normalizer) — exp_len_sum
  relative to itself, alpha and left per summed term (each term is at most 1; left = 1 - a top-K
  sum has no float32 precision relative to its own small value) — and within REL_TORCH of torch's
  own softmax (the worst values are printed);
- summary.json's train_vs_serve sets: train.jsonl summed, every figure (accuracy, weighted accuracy,
  lengths, per-k rates) as train_report.c defines it;
- the walk against the replay's rounds (results.jsonl round_lengths) where every round had a full
  block: the same round starts and accepted lengths, but for the last round, whose drafts the walk
  stops at the eos (the replay accepts drafts past it); walk len_sum = tokens - 1 (a round whose
  drafts reach the eos commits no bonus token), so the walk's tau equals the replay's;
- --resume after deleting the last train.jsonl line recomputes it identically; saved features with
  the same seed draw the same random anchors; another --seed changes random_anchors, not "all"."""
import json
import math
import os
import sys
import tempfile
import time

import torch
from tokenizers import Tokenizer

from dfltest import DFL, SOURCE, Tally, run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specforge_ref as S  # noqa: E402

torch.set_num_threads(1)
t = Tally("train metrics")
tmp = tempfile.mkdtemp(prefix="dfl-train-metrics-")
ET, ED = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
PROMPTS = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
N_PROMPTS, MAX_NEW, ANCHORS, B = 5, 128, 40, 16
ENV = dict(os.environ, OMP_NUM_THREADS="1")  # a tiny model on shared cores: one thread is fastest
FEAT, OUT = os.path.join(tmp, "feat"), os.path.join(tmp, "out")
REL = 1e-6   # float sums vs the dfl-rounding reference
REL_TORCH = 1e-5  # ... vs torch's softmax (measured up to 2.3e-6: float32 exp and quotient)
INTS = ("valid", "correct", "cont", "reach")


def dfl_eval(*args):
    return run([DFL, "eval", "--progress", "none", *map(str, args)], env=ENV)


def lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def key(r):
    return (r["prompt_id"], r["turn"], r["labels"], r["features"])


def near_ties(res, k):
    """(anchor, gap) of the slot-k decisions within S.TIE of flipping."""
    m = res["margin"][:, k - 1]
    v = res["valid"][:, k - 1]
    return [(res["anchors"][i], float(m[i])) for i in range(len(res["anchors"])) if v[i] and abs(float(m[i])) < S.TIE]


def compare(what, got, want, res, ref_torch):
    """Integer counts equal (flips only as reported near ties), float sums within REL of the dfl-rounding
    reference (alpha and left per term: each term is at most 1 and left = 1 - a top-K sum, so the
    bound is REL x the number of terms), and within REL_TORCH of torch's softmax. Returns the worst
    relative differences seen."""
    ties = {k: near_ties(res, k) for k in range(1, B)}
    flips = 0
    for f in INTS:
        for k in range(1, B):
            d = abs(got[f][k - 1] - want[f][k - 1])
            if d and f == "correct":
                flips += d
                if t.check(d <= len(ties[k]), f"{what}: {f}[{k}] dfl {want[f][k - 1]} reference {got[f][k - 1]}, "
                                              f"near ties {ties[k]}"):
                    print(f"note: {what}: correct[{k}] differs by {d}: near tie(s) {ties[k]} (logit gap < {S.TIE})")
    if not flips:  # without a flip, everything derived from the decisions equals too
        for f in INTS:
            t.check(got[f] == want[f], f"{what}: {f} dfl {want[f]} reference {got[f]}")
        t.check(got["anchors"] == want["anchors"] and got["len_sum"] == want["len_sum"],
                f"{what}: anchors/len_sum dfl {want['anchors']}/{want['len_sum']} reference {got['anchors']}/{got['len_sum']}")
    worst = {}
    if "exp_anchors" not in want:
        t.check("alpha" not in got, f"{what}: dfl has no expected acceptance, the reference does")
        return worst
    for name, ref, lim in (("dfl-rounding", got, REL), ("torch", ref_torch, REL_TORCH)):
        e = abs(ref["exp_len_sum"] - want["exp_len_sum"]) / want["exp_len_sum"]
        a = max(abs(x - y) / n for x, y, n in zip(ref["alpha"], want["alpha"], want["valid"]) if n)
        lf = max(abs(x - y) / n for x, y, n in zip(ref["left"], want["left"], want["valid"]) if n)
        worst[name] = (e, a, lf)  # no argmax in these (but a flip in "all" would move the walk's anchors)
        t.check(e <= lim and a <= lim and lf <= lim, f"{what}: vs the {name} reference: exp_len_sum rel {e:.2e}, "
                                                     f"alpha per term {a:.2e}, left per term {lf:.2e} (limit {lim:g})")
        t.check(want["exp_anchors"] == want["anchors"], f"{what}: exp_anchors {want['exp_anchors']}")
    return worst


def dataset_sequence(pid_index, n_prompt_ids):
    """prompt ids + the reference answer + <|im_end|>, cut at MAX_NEW (what dfl's dataset_truth builds)."""
    ex = lines(PROMPTS)[pid_index]
    tok = Tokenizer.from_file(os.path.join(ET, "tokenizer.json"))
    a = tok.encode(ex["answer"] + "<|im_end|>", add_special_tokens=False).ids[:MAX_NEW]
    return torch.cat([n_prompt_ids, torch.tensor(a, dtype=torch.long)])


def hidden_layers(x, layers):
    path = os.path.join(tmp, "hidden.safetensors")
    run([DFL, "hidden", "--target", ET, "--layers", ",".join(map(str, layers)), "--prompt-ids",
         ",".join(map(str, x.tolist())), "--out", path], env=ENV)
    from safetensors.torch import load_file
    d = load_file(path)
    t.check(d["input_ids"].tolist() == x.tolist(), "dfl hidden ran the sequence given")
    return {k: d[f"layer.{k}"].float() for k in layers}


def test_reference():
    t0 = time.time()
    ref = S.Reference(ED, ET, softmax="dfl")
    ref_t = S.Reference.__new__(S.Reference)
    ref_t.__dict__.update(ref.__dict__, how="torch")
    rows = lines(os.path.join(OUT, "train.jsonl"))
    man = {m["prompt_id"]: m for m in lines(os.path.join(FEAT, "manifest.jsonl"))}
    labels = sorted({r["labels"] for r in rows})
    t.check(labels == ["dataset", "target"] and len(rows) == 2 * N_PROMPTS,
            f"rows: {len(rows)} with labels {labels}, expected {N_PROMPTS} x (dataset, target)")
    worst = {"dfl-rounding": [0, 0, 0], "torch": [0, 0, 0]}
    walks = []
    for r in rows:
        f = S.read_features(os.path.join(FEAT, man[r["prompt_id"]]["file"]))
        if r["labels"] == "target":
            x, layers = f["x"], f["layers"]
        else:
            x = dataset_sequence(man[r["prompt_id"]]["index"], f["x"][:f["n_prompt"]])
            layers = hidden_layers(x[:-1], sorted(f["layers"]))
        what = f"prompt {r['prompt_id']} {r['labels']} labels"
        np_, T = f["n_prompt"], len(x)
        t.check(r["prompt_tokens"] == np_ and r["tokens"] == T - np_ and r["valid_anchors"] == T - 1 - np_,
                f"{what}: prompt {r['prompt_tokens']} tokens {r['tokens']} anchors {r['valid_anchors']}, "
                f"the reference builds {np_} + {T - np_}")
        ra = r["random_anchors"]
        t.check(ra == sorted(set(ra)) and all(np_ <= p <= T - 2 for p in ra) and
                len(ra) == min(ANCHORS, T - 1 - np_), f"{what}: random anchors {ra[:5]}... not {ANCHORS} distinct valid ones")
        got, res = ref.row(x, np_, layers, ra)
        got_t, _ = ref_t.row(x, np_, layers, ra)
        for s in ("random", "all", "walk"):
            w = compare(f"{what}, {s}", got[s], r[s], res[s], got_t[s])
            for name, v in w.items():
                worst[name] = [max(a, b) for a, b in zip(worst[name], v)]
        if r["labels"] == "target":
            walks.append((r, res["walk"], T))
    print(f"reference vs dfl on {len(rows)} rows ({time.time() - t0:.1f} s): integer counts equal; worst float "
          f"differences (exp_len_sum rel, alpha per term, left per term): dfl-rounding softmax "
          f"{', '.join(f'{v:.1e}' for v in worst['dfl-rounding'])}; torch softmax "
          f"{', '.join(f'{v:.1e}' for v in worst['torch'])}")
    return walks


def test_walk_vs_replay(walks):
    res = {r["prompt_id"]: r for r in lines(os.path.join(OUT, "results.jsonl"))
           if r["method"] == "replay" and r["mode"] == "chain" and r.get("features", "dfl") == "dfl"}
    checked = 0
    for r, w, T in walks:
        rep = res[r["prompt_id"]]
        n, rl = rep["tokens"], rep["round_lengths"]
        full_blocks = rep.get("stop", "eos") != "max_new" and n - 1 + B <= MAX_NEW and T - r["prompt_tokens"] == n
        if not full_blocks:
            print(f"note: prompt {r['prompt_id']}: {n} tokens, a round near --max-new {MAX_NEW} drafts a shorter block: "
                  "walk not compared round by round")
            continue
        checked += 1
        leads = w["lead"].tolist()
        starts = w["anchors"]
        caps = [T - 1 - p for p in starts]
        want = rl[:-1] + [min(rl[-1], caps[-1])]
        t.check(leads == want, f"prompt {r['prompt_id']}: walk leads {leads} != the replay's rounds {rl} "
                               f"(last capped at the eos: {caps[-1]})")
        reached_eos = rl[-1] >= caps[-1]
        # a round whose drafts reach the eos ends the output: no bonus, as in serving
        t.check(r["walk"]["anchors"] == len(rl) and r["walk"]["len_sum"] == n - 1,
                f"prompt {r['prompt_id']}: walk {r['walk']['anchors']} rounds len_sum {r['walk']['len_sum']}, replay "
                f"{len(rl)} rounds, {n} tokens (last round reached the eos: {reached_eos})")
        tau_w, tau_r = r["walk"]["len_sum"] / r["walk"]["anchors"], (n - 1) / len(rl)
        t.check(abs(tau_w - tau_r) < 1e-12, f"prompt {r['prompt_id']}: walk tau {tau_w} != replay tau {tau_r}")
    t.check(checked >= 2, f"only {checked} responses ended with full blocks")


def derived(c, gamma=7.0):
    """summary.json's figures of a count object (train_report.c's definitions)."""
    K = len(c["valid"])
    v, ok = sum(c["valid"]), sum(c["correct"])
    w = [math.exp(-k / gamma) for k in range(K)]
    acc = [c["correct"][k] / c["valid"][k] if c["valid"][k] else None for k in range(K)]
    e, p = 1.0, 1.0
    for a in acc:
        if a is None:
            break
        p *= a
        e += p
    d = {"anchors": c["anchors"], "accuracy": ok / v, "simulated_acceptance_length": c["len_sum"] / c["anchors"],
         "accuracy_weighted": sum(wk * x for wk, x in zip(w, c["correct"])) / sum(wk * x for wk, x in zip(w, c["valid"])),
         "length_from_accuracy": e, "accuracy_per_k": acc,
         "conditional_per_k": [c["reach"][k] / c["cont"][k] if c["cont"][k] else None for k in range(K)],
         "marginal_per_k": [c["reach"][k] / c["valid"][k] if c["valid"][k] else None for k in range(K)]}
    if "exp_anchors" in c:
        d["expected_length_t1"] = c["exp_len_sum"] / c["exp_anchors"]
        d["alpha_per_k"] = [c["alpha"][k] / c["valid"][k] if c["valid"][k] else None for k in range(K)]
        d["target_mass_left_out_per_k"] = [c["left"][k] / c["valid"][k] if c["valid"][k] else None for k in range(K)]
    return d


def test_summary():
    """summary.json's train_vs_serve sets are train.jsonl summed, with train_report.c's figures."""
    rows = lines(os.path.join(OUT, "train.jsonl"))
    s = json.load(open(os.path.join(OUT, "summary.json")))["train_vs_serve"]
    t.check(s["num_anchors"] == ANCHORS and s["target_top_k"] == 64 and s["gamma"] == 7, f"settings {s}")
    n = 0
    for d in s["drafters"]:
        for st in d["sets"]:
            rs = [r for r in rows if r["drafter"] == d["drafter"] and r["labels"] == st["labels"] and
                  r["features"] == st["features"]]
            t.check(st["responses"] == len(rs) > 0, f"{st['labels']}: {st['responses']} responses, {len(rs)} rows")
            for name, src in (("random_anchors", "random"), ("all_anchors", "all"), ("serving_walk", "walk")):
                tot = {}
                for r in rs:
                    for f, v in r[src].items():
                        tot[f] = [a + b for a, b in zip(tot[f], v)] if isinstance(v, list) and f in tot else (
                            tot.get(f, 0) + v if not isinstance(v, list) else list(v))
                want = derived(tot)
                for f, v in want.items():
                    got = st[name][f]
                    vs = v if isinstance(v, list) else [v]
                    gs = got if isinstance(got, list) else [got]
                    ok = len(vs) == len(gs) and all((a is None and b is None) or (a is not None and b is not None and
                                                                                  abs(a - b) <= 1e-6) for a, b in zip(vs, gs))
                    t.check(ok, f"summary {st['labels']} {name} {f}: {got} vs train.jsonl's {v}")
                    n += 1
    print(f"summary.json: {n} figures equal train.jsonl's counts")


def test_resume():
    path = os.path.join(OUT, "train.jsonl")
    before = lines(path)
    with open(path) as f:
        text = f.read().splitlines(keepends=True)
    with open(path, "w") as f:
        f.writelines(text[:-1])
    dfl_eval(*COMMON, "--out", OUT, "--resume")
    after = lines(path)

    def strip(r):
        return {k: v for k, v in r.items() if k != "draft_s"}
    t.check(len(after) == len(before) and strip(after[-1]) == strip(before[-1]) and
            [strip(x) for x in after[:-1]] == [strip(x) for x in before[:-1]],
            f"--resume: {len(after)} rows (had {len(before)}), the recomputed last row differs: "
            f"{json.dumps(strip(after[-1]))[:300]} vs {json.dumps(strip(before[-1]))[:300]}")


def test_seed():
    base = {key(r): r for r in lines(os.path.join(OUT, "train.jsonl")) if r["labels"] == "target"}
    outs = {}
    for seed in (0, 7):
        o = os.path.join(tmp, f"seed{seed}")
        dfl_eval("--features", FEAT, "--drafter", ED, "--train-metrics", "--train-anchors", ANCHORS, "--seed", seed,
                 "--out", o)
        outs[seed] = {key(r): r for r in lines(os.path.join(o, "train.jsonl"))}
        t.check(set(outs[seed]) == set(base), f"seed {seed} on saved features: rows {sorted(outs[seed])} vs {sorted(base)}")
    sub = [k for k in base if base[k]["valid_anchors"] > ANCHORS]
    t.check(len(sub) >= 2, f"only {len(sub)} responses have more than {ANCHORS} anchors")
    for k in base:
        t.check(outs[0][k]["random_anchors"] == base[k]["random_anchors"] and outs[0][k]["random"] == base[k]["random"],
                f"{k}: the same seed on the saved features draws other anchors")
        t.check(outs[7][k]["all"] == base[k]["all"] and outs[7][k]["walk"] == base[k]["walk"],
                f"{k}: another seed changed 'all' or 'walk'")
        if k in sub:
            t.check(outs[7][k]["random_anchors"] != base[k]["random_anchors"], f"{k}: --seed 7 drew the same anchors")
    print(f"--seed 7: random_anchors differ on {sum(outs[7][k]['random_anchors'] != base[k]['random_anchors'] for k in sub)}"
          f" of {len(sub)} responses with more than {ANCHORS} anchors; 'all' and 'walk' unchanged")


COMMON = ["--target", ET, "--drafter", ED, "--prompts", PROMPTS, "--format", "gsm8k", "--limit", N_PROMPTS,
          "--max-new", MAX_NEW, "--train-metrics", "--train-anchors", ANCHORS, "--save-features", FEAT]
t0 = time.time()
dfl_eval(*COMMON, "--out", OUT)
print(f"dfl eval --train-metrics on {N_PROMPTS} prompts: {time.time() - t0:.1f} s")
walks = []
try:
    walks = test_reference()
except Exception as e:  # noqa: BLE001
    t.check(False, f"reference comparison: {e!r}")
t.run(test_walk_vs_replay, walks)
t.run(test_summary)
t.run(test_resume)
t.run(test_seed)
t.done()
