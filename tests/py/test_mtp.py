"""The target's MTP head as a drafter (`--drafter mtp`, `--drafter DIR:mtp`).

- Every round's draft logits (each autoregressive MTP step) match tools/reference/mtp_reference.py
  (transformers' Qwen3.5 layer and norms, vLLM's MTP wiring) within 1e-4 relative, and the drafted
  tokens are its argmax path: random heads (F32 tied, BF16 untied) and the fitted head of
  qwen35_mtp, whose drafts are accepted (the context then grows by several positions a round).
- Lossless: greedy output with the MTP drafter equals autoregressive decoding, chain at several
  block sizes and DDTree, with drafts accepted; DIR:mtp takes the head of another checkpoint
  (a text-only export, which has none, with the head of the VLM checkpoint of the same weights).
- dfl eval puts a DFlash drafter, a DFlash2 drafter and the MTP head in one table; replay equals online for each,
  whether the MTP records the truth or replays one a DFlash2 drafter recorded.
- Qwen3.5-MoE: the MTP head of qwen35_moe_mtp (its layer's MLP a sparse MoE block with a shared
  expert, experts fused as released) matches the reference (transformers' Qwen3_5Moe layer) the
  same way, drafts identically with its experts stored per expert, and is lossless (chain, DDTree).
- A target without mtp.* tensors (or a dense Qwen3) is refused with a clear message, and an MoE
  head missing a tensor names it."""
import json
import os
import shutil
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

from dfltest import PY, SOURCE, Tally, dfl, dfl_json, fixture, run

REF = os.path.join(SOURCE, "tools", "reference", "mtp_reference.py")
t = Tally("mtp")
tmp = tempfile.mkdtemp(prefix="dfl-mtp-")
# the prompts qwen35_mtp's head was fitted on (tools/make_fixtures.py MTP_FIT_PROMPTS, MTP_FIT_TEXTS)
FIT = ["11,200,37,512,99,3,641,77,12", "300,301,302"]
TEXTS = ["The cat sat on the mat.", "Two plus two is four.", "Where is the red ball?"]


def ids_of(s):
    return [int(x) for x in s.split(",")]


def logits_match(target, ids, max_new, blocks=(None,)):
    """dfl's per-round draft logits (chain rounds: --dump-drafts keeps those) at each block size
    against the reference's, which drafts every round of every block size in one run (the
    committed sequence is the greedy one whatever the block); returns the last generate JSON. A
    DDTree round drafts the same logits: they depend on the committed context only."""
    runs, starts, steps = [], [], []
    for block in blocks:
        dump = os.path.join(tmp, f"dfl-{target}-{len(ids)}-{block}.safetensors")
        extra = ["--block-size", block] if block else []
        g = dfl_json("generate", "--target", fixture(target), "--drafter", "mtp", "--prompt-ids", ids, "--max-new",
                     max_new, "--ignore-eos", "--json", "--dump-drafts", dump, *extra)
        m = load_file(dump)
        R = sum(k.startswith("start.") for k in m)
        # every round drafts but a last one-token step near --max-new
        t.check(0 < R and len(g["stats"]["acceptance_lengths"]) - 1 <= R <= len(g["stats"]["acceptance_lengths"]),
                f"{target} block {block}: {R} rounds dumped of {len(g['stats']['acceptance_lengths'])}")
        t.check(not runs or g["tokens"] == runs[0][1]["tokens"], f"{target}: block {block} changed the output")
        runs.append((block, g, m, R, len(starts)))
        starts += [int(m[f"start.{r}"][0]) for r in range(R)]
        steps += [m[f"draft_logits.{r}"].shape[0] for r in range(R)]
    ref = os.path.join(tmp, f"ref-{target}-{len(ids)}.safetensors")
    run([PY, REF, "--target", fixture(target), "--ids", ids, "--tokens", ",".join(map(str, runs[0][1]["tokens"])),
         "--starts", ",".join(map(str, starts)), "--steps", ",".join(map(str, steps)), "--out", ref])
    r = load_file(ref)
    for block, g, m, R, base in runs:
        worst = 0.0
        for k in range(R):
            a, b = m[f"draft_logits.{k}"], r[f"draft_logits.{base + k}"]
            rel = float(np.abs(a - b).max() / np.abs(b).max())
            worst = max(worst, rel)
            t.check(a.shape == b.shape and rel < 1e-4,
                    f"{target} block {block} round {k} (start {starts[base + k]}): MTP logits rel err {rel:.3g}")
            t.check(list(m[f"block_ids.{k}"][1:]) == list(r[f"draft_ids.{base + k}"]),  # the anchor, then the argmax path
                    f"{target} block {block} round {k}: drafted {list(m[f'block_ids.{k}'][1:])} != reference "
                    f"{list(r[f'draft_ids.{base + k}'])}")
        print(f"{target} prompt {len(ids.split(','))} tokens, block {block or 4}: {R} rounds, tau "
              f"{g['stats']['tau']:.2f}, worst rel err {worst:.2g}", flush=True)
    return runs[-1][1]


def reference_logits():
    logits_match("qwen35_vlm", FIT[0], 12)
    logits_match("qwen35_bf16", FIT[1], 10, blocks=("6",))
    g = logits_match("qwen35_mtp", FIT[0], 40, blocks=("8", None))
    t.check(g["stats"]["tau"] > 2, f"qwen35_mtp: the fitted head's drafts are accepted (tau {g['stats']['tau']})")


def lossless_on(target):
    for ids in FIT + ["1,2,3,4"]:
        greedy = dfl_json("generate", "--target", fixture(target), "--prompt-ids", ids, "--max-new", 40,
                          "--ignore-eos", "--json")["tokens"]
        for extra in ([], ["--block-size", "2"], ["--block-size", "8"], ["--tree-budget", "4"],
                      ["--tree-budget", "16"], ["--block-size", "8", "--tree-budget", "32"]):
            g = dfl_json("generate", "--target", fixture(target), "--drafter", "mtp", "--prompt-ids", ids,
                         "--max-new", 40, "--ignore-eos", "--json", *extra)
            t.check(g["tokens"] == greedy, f"{target} prompt {ids} {extra}: MTP speculative output != greedy")
            if ids in FIT:
                t.check(g["stats"]["accepted"] > 0, f"{target} prompt {ids} {extra}: no draft accepted")


def lossless():
    lossless_on("qwen35_mtp")
    # DIR:mtp: the text-only export (no mtp.*) with the head of the VLM checkpoint of the same weights
    own = dfl_json("generate", "--target", fixture("qwen35_mtp"), "--drafter", "mtp", "--prompt-ids", FIT[1],
                   "--max-new", 30, "--ignore-eos", "--json")
    other = dfl_json("generate", "--target", fixture("qwen35_text"), "--drafter", fixture("qwen35_mtp") + ":mtp",
                     "--prompt-ids", FIT[1], "--max-new", 30, "--ignore-eos", "--json")
    t.check(other["tokens"] == own["tokens"] and other["stats"]["acceptance_lengths"] ==
            own["stats"]["acceptance_lengths"], "DIR:mtp on the text-only export: the same rounds as the VLM's own head")


def per_expert_copy(src, dst):
    """src with its MTP head's fused experts stored per expert (mlp.experts.{e}.*_proj.weight)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    w = load_file(path)
    pre = "mtp.layers.0.mlp.experts."
    gate_up, down = w.pop(pre + "gate_up_proj"), w.pop(pre + "down_proj")
    Ie = down.shape[2]
    for e in range(gate_up.shape[0]):
        w[f"{pre}{e}.gate_proj.weight"] = np.ascontiguousarray(gate_up[e, :Ie])
        w[f"{pre}{e}.up_proj.weight"] = np.ascontiguousarray(gate_up[e, Ie:])
        w[f"{pre}{e}.down_proj.weight"] = np.ascontiguousarray(down[e])
    save_file(w, path, metadata={"format": "pt"})


def moe_head():
    """qwen35_moe_mtp: an MoE target's own MoE MTP head, against the reference, in both expert
    layouts, lossless."""
    g = logits_match("qwen35_moe_mtp", FIT[1], 24, blocks=("6", None))
    t.check(g["stats"]["accepted"] > 0, f"qwen35_moe_mtp: the fitted head's drafts are accepted ({g['stats']})")
    per = os.path.join(tmp, "qwen35_moe_mtp_per_expert")
    per_expert_copy(fixture("qwen35_moe_mtp"), per)
    dumps = []
    for d in (fixture("qwen35_moe_mtp"), per):
        f = os.path.join(tmp, f"layout-{len(dumps)}.safetensors")
        dfl("generate", "--target", d, "--drafter", "mtp", "--prompt-ids", FIT[0], "--max-new", 24, "--ignore-eos",
            "--dump-drafts", f)
        dumps.append(load_file(f))
    t.check(dumps[0].keys() == dumps[1].keys() and all(np.array_equal(dumps[0][k], dumps[1][k]) for k in dumps[0]),
            "qwen35_moe_mtp: per-expert MTP experts draft bit-identically to the fused ones")
    lossless_on("qwen35_moe_mtp")


def summary_rows(out):
    s = json.load(open(os.path.join(out, "summary.json")))
    return {(r["drafter"], r["mode"], r.get("method")): r for r in s["results"]}


def evaluate():
    """The three kinds of drafter in one eval: a DFlash drafter, a DFlash2 drafter and the target's
    MTP head, chain and DDTree, on the same prompts; whichever records, every replay row equals its
    online row."""
    prompts = os.path.join(tmp, "texts.txt")
    with open(prompts, "w") as f:
        f.write("\n".join(TEXTS) + "\n")
    mtp = f"mtp ({fixture('qwen35_mtp')})"
    d1, d2 = fixture("dflash_qwen35"), fixture("dflash2_qwen35")
    common = ["--target", fixture("qwen35_mtp"), "--prompts", prompts, "--format", "text", "--chat", "none",
              "--max-new", 32, "--tree-budget", "0,4"]
    online = os.path.join(tmp, "online")
    dfl("eval", "--online", "--drafter", "mtp", "--drafter", d1, "--drafter", d2, *common, "--out", online)
    on = summary_rows(online)
    for order in (["mtp", d1, d2], [d2, d1, "mtp"]):
        out = os.path.join(tmp, "replay-" + os.path.basename(order[0]))
        dfl("eval", "--drafter", order[0], "--drafter", order[1], "--drafter", order[2], *common, "--check-ar",
            "--out", out)
        rows = summary_rows(out)
        md = open(os.path.join(out, "summary.md")).read()
        t.check(all(f"| {x} |" in md for x in (mtp, d1, d2)),
                f"{order}: one table with the DFlash drafter, the DFlash2 drafter and the MTP head")
        for label in (mtp, d1, d2):
            for mode in ("chain", "ddtree-4"):
                r, o = rows[(label, mode, "replay")], on[(label, mode, "online")]
                t.check(r["mismatches"] == 0 and r["accept_hist"] == o["accept_hist"] and r["tau"] == o["tau"] and
                        r["per_position"] == o["per_position"],
                        f"{order} {label} {mode}: replay {r['tau']} {r['accept_hist']} != online {o['tau']} "
                        f"{o['accept_hist']}")
        t.check(rows[(mtp, "chain", "replay")]["tau"] > 2, f"{order}: MTP drafts accepted in eval")
    print(f"eval: MTP chain tau {on[(mtp, 'chain', 'online')]['tau']:.3f}, ddtree-4 "
          f"{on[(mtp, 'ddtree-4', 'online')]['tau']:.3f}; replay = online", flush=True)


def refused():
    cases = [(["generate", "--target", fixture("qwen35_text"), "--drafter", "mtp", "--prompt-ids", "1,2"],
              "has no MTP head: no mtp.* tensors"),
             (["generate", "--target", fixture("qwen3_tiny"), "--drafter", "mtp", "--prompt-ids", "1,2"],
              "model_type 'qwen3' has no MTP head"),
             (["generate", "--target", fixture("qwen35_vlm"), "--drafter", os.path.join(tmp, "none") + ":mtp",
               "--prompt-ids", "1,2"], "not a directory"),
             (["eval", "--target", fixture("qwen35_text"), "--drafter", "mtp", "--prompts", os.path.join(tmp, "x.txt"),
               "--format", "text", "--out", os.path.join(tmp, "refused")], "has no MTP head: no mtp.* tensors"),
             (["serve", "--target", fixture("qwen35_text"), "--drafter", "mtp", "--port", "0"],
              "has no MTP head: no mtp.* tensors")]
    # an MoE head missing its shared expert's gate
    broken = os.path.join(tmp, "moe_no_shared_gate")
    per_expert_copy(fixture("qwen35_moe_mtp"), broken)
    w = load_file(os.path.join(broken, "model.safetensors"))
    del w["mtp.layers.0.mlp.shared_expert_gate.weight"]
    save_file(w, os.path.join(broken, "model.safetensors"), metadata={"format": "pt"})
    cases.append((["generate", "--target", broken, "--drafter", "mtp", "--prompt-ids", "1,2"],
                  "mtp.layers.0.mlp.shared_expert_gate.weight"))
    with open(os.path.join(tmp, "x.txt"), "w") as f:
        f.write("hello\n")
    for args, want in cases:
        p = dfl(*args, check=False, timeout=60)
        t.check(p.returncode != 0 and want in p.stderr, f"{args[0]} {args[2:5]}: rc {p.returncode}, stderr {p.stderr!r}")


t.run(reference_logits)
t.run(lossless)
t.run(moe_head)
t.run(evaluate)
t.run(refused)
t.done()
