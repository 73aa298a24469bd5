"""tau of the same drafters on several targets side by side (a BF16 target and its FP8 release:
how much acceptance the FP8 target costs), from the summary.json of one `dfl eval` run per
target on the same prompts (docs/fp8.md):

    python tools/eval_compare.py EVAL_DIR1 EVAL_DIR2 [...] [--json]

A markdown table: a row per drafter x mode x method (online, replay) found in every run, a column
per run with tau (z-lab's per-response mean) and tau_token_weighted, and the change of tau from
the first run in percent. --json prints the same rows as JSON lines.
"""
import argparse
import json
import os
import sys


def load(d):
    with open(os.path.join(d, "summary.json")) as f:
        s = json.load(f)
    return s, {(r["drafter"], r["mode"], r["method"]): r for r in s["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="dfl eval output directories (the first is the baseline)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if len(a.runs) < 2:
        ap.error("give at least two eval directories")
    runs = [load(d) for d in a.runs]
    prompts = {s["prompts"] for s, _ in runs}
    if len(prompts) != 1:
        print(f"eval_compare: the runs hold different prompt counts {sorted(prompts)}: compare runs on the same "
              "prompts", file=sys.stderr)
        return 1
    keys = [k for k in runs[0][1] if all(k in rows for _, rows in runs[1:])]
    if not keys:
        print("eval_compare: no drafter x mode row common to every run", file=sys.stderr)
        return 1
    if not a.json:
        print("| drafter | mode | " + " | ".join(f"tau {d}" for d in a.runs) + " | " +
              " | ".join(f"change {d}" for d in a.runs[1:]) + " |")
        print("|---" * (2 + 2 * len(a.runs) - 1) + "|")
    for k in keys:
        rows = [r[k] for _, r in runs]
        base = rows[0]["tau"]
        change = [100.0 * (r["tau"] / base - 1.0) if base else 0.0 for r in rows[1:]]
        if a.json:
            print(json.dumps({"drafter": k[0], "mode": k[1], "method": k[2], "runs": a.runs,
                              "tau": [r["tau"] for r in rows], "tau_token_weighted": [r["tau_token_weighted"] for r in rows],
                              "change_percent": change, "mismatches": [r["mismatches"] for r in rows]}))
        else:
            mode = k[1] + (" (online)" if k[2] == "online" else "")
            print(f"| {k[0]} | {mode} | " + " | ".join(f"{r['tau']:.3f} ({r['tau_token_weighted']:.3f})" for r in rows) +
                  " | " + " | ".join(f"{c:+.1f}%" for c in change) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
