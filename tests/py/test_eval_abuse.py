"""`dfl eval` under abuse: killed with SIGKILL at many moments (also while writing the summary) and
resumed, the per-prompt results equal an uninterrupted run with no torn or duplicate line; two
evals on one --out (the second refused by the lock); a full disk (a clear error, nothing torn)."""
import fcntl
import json
import os
import signal
import subprocess
import tempfile
import time

from dfltest import DFL, SOURCE, Tally, dfl

t = Tally("eval_abuse")
tmp = tempfile.mkdtemp(prefix="dfl-abuse-")
ET, ED = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
PROMPTS = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
ARGS = ["--target", ET, "--drafter", ED, "--prompts", PROMPTS, "--limit", 6, "--max-new", 96, "--tree-budget",
        "0,8", "--progress", "none", "--cost-reps", 0]
KEEP = ("tokens", "rounds", "drafted", "accepted", "accept_hist", "pos_drafted", "pos_accepted", "round_lengths",
        "tree_depth_sum")


def results(d):
    with open(os.path.join(d, "results.jsonl")) as f:
        text = f.read()
    t.check(text == "" or text.endswith("\n"), f"{d}: results.jsonl ends with a complete line")
    rs = [json.loads(x) for x in text.splitlines() if x.strip()]
    return {(r["prompt_id"], r["turn"], r["drafter"], r["mode"], r["method"]): r for r in rs}, len(rs)


def comparable(rs):
    return {k: tuple(json.dumps(r[s]) for s in KEEP) for k, r in rs.items()}


def kill_and_resume():
    base = os.path.join(tmp, "base")
    dfl("eval", *ARGS, "--out", base)
    want, _ = results(base)
    # the uninterrupted run's wall time bounds the kill moments
    t0 = time.monotonic()
    dfl("eval", *ARGS, "--out", os.path.join(tmp, "timing"))
    span = time.monotonic() - t0
    for i, frac in enumerate((0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.97, 1.5)):
        out = os.path.join(tmp, f"kill{i}")
        p = subprocess.Popen([DFL, "eval", *map(str, ARGS), "--out", out], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            p.wait(timeout=span * frac)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
        r = dfl("eval", *ARGS, "--out", out, "--resume", check=False)
        t.check(r.returncode == 0, f"kill at {frac:.2f} of the run, --resume: {r.stderr[-300:]}")
        got, n = results(out)
        t.check(n == len(got), f"kill at {frac:.2f}: {n - len(got)} duplicate lines")
        t.check(comparable(got) == comparable(want), f"kill at {frac:.2f}: resumed results differ from an "
                                                     f"uninterrupted run ({len(got)} vs {len(want)} responses)")
        t.check(os.path.exists(os.path.join(out, "summary.json")), f"kill at {frac:.2f}: summary written")


def lock():
    out = os.path.join(tmp, "locked")
    os.makedirs(out)
    with open(os.path.join(out, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another eval holds the directory
        p = dfl("eval", *ARGS, "--out", out, check=False)
    t.check(p.returncode == 1 and "another dfl eval" in p.stderr and not os.path.exists(os.path.join(out, "results.jsonl")),
            f"a second eval on one --out is refused before writing: {p.stderr[-300:]}")
    p = dfl("eval", *ARGS, "--limit", 1, "--out", out, check=False)
    t.check(p.returncode == 0, f"once the lock is released the directory is usable: {p.stderr[-300:]}")


def full_disk():
    mnt = os.path.join(tmp, "small")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", mnt], capture_output=True).returncode:
        print("[eval_abuse] full disk: skipped (cannot mount a small tmpfs here)", flush=True)
        return
    try:
        out = os.path.join(mnt, "out")
        p = dfl("eval", *ARGS, "--out", out, check=False)
        t.check(p.returncode == 1 and "No space left" in p.stderr and out in p.stderr,
                f"a full disk is a clear error naming the file: {p.stderr[-300:]}")
        moved = os.path.join(tmp, "full-moved")
        subprocess.run(["cp", "-r", out, moved], check=True)
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
    os.remove(os.path.join(moved, ".lock"))
    r = dfl("eval", *ARGS, "--out", moved, "--resume", check=False)
    got, n = results(moved)
    want, _ = results(os.path.join(tmp, "base"))
    t.check(r.returncode == 0 and n == len(got) and comparable(got) == comparable(want),
            f"what the full disk left resumes to the uninterrupted results: {r.stderr[-300:]}")


t.run(kill_and_resume)
t.run(lock)
t.run(full_disk)
t.done()
