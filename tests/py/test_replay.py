"""Replay evaluation (docs/eval.md): per-round accepted lengths, tau and every statistic of a replay
equal the online runs' exactly, on the hybrid embedded pair and on the dense, hybrid and MoE fixtures, for
chain and DDTree budgets {4, 8, 16, 64}, first and second MT-Bench turns, with the truth recorded in
chain mode and replayed in tree modes and back; saved features replayed without a target forward;
features from another pipeline (transformers, float32 and bfloat16) side by side; refusals of
features that do not fit (other target, other layers, truncated file) and of temperature > 0; many
truths replayed in lockstep (--replay-batch) as one at a time."""
import json
import os
import shutil
import subprocess
import tempfile

from dfltest import DATA, PY, SOURCE, Tally, dfl, fixture

t = Tally("replay")
tmp = tempfile.mkdtemp(prefix="dfl-replay-")
GSM = os.path.join(DATA, "datasets", "gsm8k", "test.jsonl")
MTB = os.path.join(DATA, "datasets", "mt_bench", "question.jsonl")
ET, ED = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
EMB_PROMPTS = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
STATS = ("tokens", "rounds", "drafted", "accepted", "tree_depth_sum", "tree_nodes", "accept_hist", "pos_drafted",
         "pos_accepted", "round_lengths")


def lines(d):
    with open(os.path.join(d, "results.jsonl")) as f:
        return [json.loads(x) for x in f if x.strip()]


def by_key(rs, method):
    return {(r["prompt_id"], r["turn"], r["drafter"], r["mode"]): r for r in rs
            if r["method"] == method and r["mode"] != "ar" and r.get("features", "dfl") == "dfl"}


def eval_(out, *args, check=True):
    return dfl("eval", "--out", os.path.join(tmp, out), "--progress", "none", *args, check=check)


def same_stats(online, replay, what):
    """Every online run has a replay with identical statistics."""
    t.check(set(online) <= set(replay), f"{what}: replay lacks {sorted(set(online) - set(replay))[:3]}")
    bad = [k for k in online if k in replay and any(online[k][s] != replay[k][s] for s in STATS)]
    t.check(not bad, f"{what}: {len(bad)} of {len(online)} responses differ, e.g. {bad[:2]}: "
                     + (str([(s, online[bad[0]][s], replay[bad[0]][s]) for s in STATS
                             if online[bad[0]][s] != replay[bad[0]][s]])[:600] if bad else ""))
    return not bad


def past_eos(rs):
    """Responses whose last round accepted drafts past the eos (the case the truth's continuation serves)."""
    return [r for r in rs if sum(a + 1 for a in r["round_lengths"]) + 1 > r["tokens"]]


def case(name, target, drafters, prompts, n, max_new, budgets, extra=()):
    common = ["--target", target, *sum((["--drafter", d] for d in drafters), []), "--prompts", prompts,
              "--limit", n, "--max-new", max_new, "--tree-budget", budgets, *extra]
    eval_(f"{name}-online", "--online", *common)
    on = by_key(lines(os.path.join(tmp, f"{name}-online")), "online")
    eval_(f"{name}-chain", *common, "--record-mode", "chain", "--check-ar")
    rc = lines(os.path.join(tmp, f"{name}-chain"))
    same_stats(on, by_key(rc, "replay"), f"{name}: recorded in chain mode")
    rec = by_key(rc, "online")
    same_stats(rec, on, f"{name}: the recording run is the online chain run")
    t.check(all(r["match"] for r in rc if r["method"] == "online" and r["mode"] != "ar"),
            f"{name}: recorded truths equal the autoregressive outputs")
    eval_(f"{name}-tree", *common, "--record-mode", "ddtree-8")
    same_stats(on, by_key(lines(os.path.join(tmp, f"{name}-tree")), "replay"), f"{name}: recorded in ddtree-8 mode")
    # auto: chain rounds and decode steps mixed as costs dictate; the truth and every replay the same
    eval_(f"{name}-auto", *common, "--record-mode", "auto", "--check-ar")
    ra = lines(os.path.join(tmp, f"{name}-auto"))
    same_stats(on, by_key(ra, "replay"), f"{name}: recorded in auto mode")
    recs = [r for r in ra if r["method"] == "record"]
    t.check(len(recs) == len(on) // len(budgets.split(",")) // len(drafters) and all(r["match"] for r in recs)
            and all(r["mode"] == "auto" for r in recs) and not any(r["method"] == "online" and r["mode"] != "ar"
                                                                   for r in ra),
            f"{name}: auto: one record line per response, equal to the autoregressive run, no online row")
    sa = json.load(open(os.path.join(tmp, f"{name}-auto", "summary.json")))
    t.check(sa["run"]["recording"]["mode"] == "auto" and not any(r["mode"] == "auto" for r in sa["results"]),
            f"{name}: auto: summary.json names the recording mode and has no row for it")
    s = json.load(open(os.path.join(tmp, f"{name}-chain", "summary.json")))
    t.check(s["run"]["method"] == "replay" and s["costs"]["measured"] and
            all(r["speedup_modeled"] for r in s["results"] if r["method"] == "replay"),
            f"{name}: modeled speedups from measured costs")
    return on


def embedded():
    on = case("emb", ET, [ED], EMB_PROMPTS, 8, 256, "0,4,8,16,64")
    taus = {r["mode"] for r in on.values() if r["rounds"] and (r["tokens"] - 1) / r["rounds"] > 2}
    t.check("chain" in taus, f"the embedded drafter gets tokens accepted (modes with tau > 2: {taus})")
    t.check(past_eos(on.values()), "some online round accepted drafts past an eos (the continuation is exercised)")
    out = os.path.join(tmp, "emb-chain")
    svg = open(os.path.join(out, "tau_budget.svg")).read()
    t.check("<polyline" in svg and "stroke-dasharray" in svg, "tau_budget.svg: budgets as a line, chain dashed")
    md = open(os.path.join(out, "summary.md")).read()
    t.check("modeled" in md and "(online)" in md, "summary.md: modeled speedup, the online recording row marked")


def fixtures():
    case("dense", fixture("qwen3_tiny"), [fixture("dflash_qwen3"), fixture("dflash_qwen3_toplevel")], GSM, 3, 24,
         "0,4,16")
    case("hybrid", fixture("qwen35_text"), [fixture("dflash_qwen35")], GSM, 3, 24, "0,8,64")
    case("moe", fixture("qwen35_moe_vlm"), [fixture("dflash_qwen35_moe")], GSM, 2, 24, "0,8")
    case("moe-dense-attn", fixture("qwen3_moe"), [fixture("dflash_qwen3")], GSM, 2, 24, "0,16")


def batches():
    """--replay-batch: replaying several truths in lockstep (one drafter forward drafting a block of
    each) gives every row that one truth at a time gives, for two drafters, chain and trees, with
    a last batch that is not full; a run cut off with truths still waiting resumes to the same rows."""
    common = ["--target", ET, "--drafter", ED, "--drafter", ED + "/", "--prompts", EMB_PROMPTS, "--limit", 7,
              "--max-new", 96, "--tree-budget", "0,4,16"]
    runs = {}
    for b in (1, 3, 64):
        eval_(f"batch{b}", *common, "--replay-batch", b)
        runs[b] = lines(os.path.join(tmp, f"batch{b}"))
    one = by_key(runs[1], "replay")
    t.check(len(one) == 7 * 2 * 3, f"one row per prompt x drafter x mode ({len(one)})")
    for b in (3, 64):
        same_stats(one, by_key(runs[b], "replay"), f"--replay-batch {b}")
        t.check(len(runs[b]) == len(runs[1]), f"--replay-batch {b}: {len(runs[b])} rows, one at a time {len(runs[1])}")
    # cut after the first batch's rows and the recording row of the next truth: as if the run had
    # stopped with that truth waiting for its batch; resumed, it is recorded again and replayed
    res = os.path.join(tmp, "batch3", "results.jsonl")
    rows = [json.loads(x) for x in open(res)]
    order = list(dict.fromkeys(r["prompt_id"] for r in rows))
    with open(res, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["prompt_id"] in order[:3]
                     or (r["prompt_id"] == order[3] and r["method"] != "replay"))
    eval_("batch3", *common, "--replay-batch", 3, "--resume")
    again = lines(os.path.join(tmp, "batch3"))
    same_stats(one, by_key(again, "replay"), "--replay-batch 3 resumed")
    t.check(len(order) == 7 and len(again) == len(runs[1]), f"resumed: {len(again)} rows, {len(runs[1])} expected")


def mtbench():
    case("mtb", ET, [ED], MTB, 2, 48, "0,8")
    rs = lines(os.path.join(tmp, "mtb-chain"))
    t.check({r["turn"] for r in rs} == {0, 1}, "MT-Bench: both turns replayed")


def features():
    feat = os.path.join(tmp, "feat")
    eval_("save", "--target", ET, "--drafter", ED, "--prompts", EMB_PROMPTS, "--limit", 4, "--max-new", 128,
          "--tree-budget", "0,8", "--save-features", feat, "--save-layers", "all")
    files = sorted(f for f in os.listdir(feat) if f.endswith(".safetensors"))
    t.check(len(files) == 4 and os.path.exists(os.path.join(feat, "target.json")), f"saved files: {files}")
    # no target forward: replay the saved truths, more budgets than recorded
    eval_("from-feat", "--features", feat, "--drafter", ED, "--tree-budget", "0,8,256,1024")
    a, b = by_key(lines(os.path.join(tmp, "save")), "replay"), by_key(lines(os.path.join(tmp, "from-feat")), "replay")
    same_stats(a, b, "--features: the saved features replay as recorded")
    t.check(any(k[3] == "ddtree-1024" for k in b), "replay takes budgets beyond what the target can verify")
    # a pipeline's features (transformers float32 / bfloat16 on the same sequences)
    for dt in ("float32", "bfloat16"):
        pipe = os.path.join(tmp, f"pipe-{dt}")
        subprocess.run([PY, os.path.join(SOURCE, "tools", "pipeline_features.py"), feat, pipe, "--dtype", dt],
                       check=True, capture_output=True, text=True)
        eval_(f"pipe-{dt}-eval", "--features", feat, "--features-from", pipe, "--drafter", ED, "--tree-budget", "0,8")
        rs = lines(os.path.join(tmp, f"pipe-{dt}-eval"))
        pipe_rows = [r for r in rs if r["features"] == "pipeline"]
        t.check(len(pipe_rows) == 8, f"{dt}: a pipeline replay per prompt x mode ({len(pipe_rows)})")
        s = json.load(open(os.path.join(tmp, f"pipe-{dt}-eval", "summary.json")))
        tau = {(r["features"], r["mode"]): r["tau"] for r in s["results"]}
        md = open(os.path.join(tmp, f"pipe-{dt}-eval", "summary.md")).read()
        t.check("pipeline features" in md and "τ dfl features" in md, f"{dt}: summary.md side by side")
        if dt == "float32":
            t.check(abs(tau[("pipeline", "chain")] - tau[("dfl", "chain")]) < 0.5,
                    f"float32 pipeline features give about dfl's tau: {tau}")
        print(f"[replay] pipeline {dt}: {tau}", flush=True)
    return feat


def refusals(feat):
    # another target of the same shapes: its config differs
    other = os.path.join(tmp, "other-target")
    shutil.copytree(ET, other)
    cfg = json.load(open(os.path.join(other, "config.json")))
    cfg["rope_theta_note"] = "changed"
    json.dump(cfg, open(os.path.join(other, "config.json"), "w"))
    p = eval_("bad1", "--features", feat, "--target", other, "--drafter", ED, check=False)
    t.check(p.returncode != 0 and "config hash" in p.stderr, f"features of another target refused: {p.stderr[-300:]}")
    # other layers: a copy saved without --save-layers, read by a drafter that wants another layer
    feat2 = os.path.join(tmp, "feat-few")
    eval_("save2", "--target", ET, "--drafter", ED, "--prompts", EMB_PROMPTS, "--limit", 1, "--max-new", 32,
          "--save-features", feat2)
    d2 = os.path.join(tmp, "drafter-other-layers")
    shutil.copytree(ED, d2)
    cfg = json.load(open(os.path.join(d2, "config.json")))
    layers = cfg.get("dflash_config", cfg).get("target_layer_ids") or cfg.get("target_layer_ids")
    new = [0 if 0 not in layers else max(layers) - 1] + layers[1:]
    if "dflash_config" in cfg and "target_layer_ids" in cfg["dflash_config"]:
        cfg["dflash_config"]["target_layer_ids"] = new
    else:
        cfg["target_layer_ids"] = new
    json.dump(cfg, open(os.path.join(d2, "config.json"), "w"))
    p = eval_("bad2", "--features", feat2, "--drafter", d2, check=False)
    t.check(p.returncode != 0 and "layer." in p.stderr, f"features without the drafter's layers refused: {p.stderr[-300:]}")
    # a truncated file
    feat3 = os.path.join(tmp, "feat-cut")
    shutil.copytree(feat2, feat3)
    f0 = os.path.join(feat3, sorted(x for x in os.listdir(feat3) if x.endswith(".safetensors"))[0])
    with open(f0, "r+b") as f:
        f.truncate(os.path.getsize(f0) // 2)
    p = eval_("bad3", "--features", feat3, "--drafter", ED, check=False)
    t.check(p.returncode != 0 and os.path.basename(f0) in p.stderr, f"truncated features refused: {p.stderr[-300:]}")
    p = eval_("bad4", "--target", ET, "--drafter", ED, "--prompts", EMB_PROMPTS, "--temperature", "0.7", check=False)
    t.check(p.returncode == 2 and "--online" in p.stderr, f"replay at T > 0 refused: {p.stderr[-300:]}")
    for args, needle in ((["--record-mode", "tree"], "--record-mode"), (["--save-layers", "1,x"], "--save-layers"),
                         (["--cost-reps", "-1"], "--cost-reps"), (["--tree-budget", "0,5000"], "--tree-budget")):
        p = eval_("bad6", "--target", ET, "--drafter", ED, "--prompts", EMB_PROMPTS, "--save-features",
                  os.path.join(tmp, "unused"), *args, check=False)
        t.check(p.returncode == 2 and needle in p.stderr, f"{args}: usage error naming the flag: {p.stderr[-200:]}")
    p = eval_("bad5", "--features", feat2, "--drafter", ED, "--max-new", 64, check=False)
    t.check(p.returncode != 0 and "max-new" in p.stderr, f"another --max-new than recorded refused: {p.stderr[-300:]}")


t.run(embedded)
t.run(fixtures)
t.run(batches)
t.run(mtbench)
try:
    f = features()
    t.run(refusals, f)
except Exception as e:  # noqa: BLE001
    t.check(False, f"features: {e}")
t.done()
