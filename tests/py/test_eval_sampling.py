"""dfl eval --online with Qwen's serving filters (--top-k / --top-p at --temperature > 0): top-k 1
leaves one token, so every sampled output (autoregressive and speculative, both accept rules)
equals the greedy one token for token; the filters reach run.json and summary.md's settings; they
are refused without a temperature. Losslessness under the filtered distribution itself is
chi-square-tested in tests/unit/test_spec.c."""
import json
import os
import tempfile

from dfltest import DATA, SOURCE, Tally, dfl

T = Tally("test_eval_sampling")
TMP = tempfile.mkdtemp(prefix="dfl_eval_sampling_")
TARGET = os.path.join(SOURCE, "models", "target")
DRAFTER = os.path.join(SOURCE, "models", "drafter")
PROMPTS = os.path.join(DATA, "gsm8k_test_40.jsonl")


def outputs(out):
    with open(os.path.join(out, "results.jsonl")) as f:
        return {(r["prompt_id"], r["drafter"], r["mode"]): r.get("output_ids") for r in map(json.loads, f)}


def main():
    greedy = os.path.join(TMP, "greedy")
    dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--limit", 3, "--max-new", 48,
        "--online", "--out", greedy)
    g = outputs(greedy)
    T.check(len(g) == 6 and all(v and len(v) > 8 for v in g.values()), f"greedy rows with their output ids: {len(g)}")
    for rule in ("pq", "match"):
        out = os.path.join(TMP, rule)
        dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--limit", 3, "--max-new", 48,
            "--online", "--temperature", "0.8", "--top-k", "1", "--top-p", "0.9", "--accept-rule", rule, "--seed", 5,
            "--out", out)
        s = outputs(out)
        T.check(s.keys() == g.keys() and all(s[k] == g[k] for k in g),
                f"{rule}: top-k 1 samples the greedy outputs, autoregressive and speculative")
        run = json.load(open(os.path.join(out, "run.json")))
        T.check(run.get("top_k") == 1 and abs(run.get("top_p", 0) - 0.9) < 1e-12, f"run.json records them: {run}")
        md = open(os.path.join(out, "summary.md")).read()
        T.check("| top-k | 1 |" in md and "| top-p | 0.9 |" in md, "summary.md's settings show them")
    p = dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--online", "--top-p", "0.9",
            "--out", os.path.join(TMP, "bad"), check=False)
    T.check(p.returncode != 0 and "--temperature" in p.stderr, f"refused without a temperature: {p.stderr[-200:]}")
    p = dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--online", "--temperature", "1",
            "--top-p", "1.5", "--out", os.path.join(TMP, "bad2"), check=False)
    T.check(p.returncode == 2 and "--top-p" in p.stderr, f"top-p outside (0, 1] refused: {p.stderr[-200:]}")


T.run(main)
T.done()
