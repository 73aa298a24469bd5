"""Nothing lost, nothing silently wrong (issue 33), on the embedded pair (models/): a resume over a
partial last line of any length; eval-merge and eval-compare judge runs by what they ran, never write
into an input nor open an output before every check; saved features whose fields disagree are refused;
two runs on one features directory; reports replaced whole; prompt files with NUL characters, odd ids
or prompts past the model's positions. Faults are made deterministic: a file-size limit (RLIMIT_FSIZE,
SIGXFSZ ignored) stands for a full disk, files are cut or edited by hand; nothing depends on timing."""
import fcntl
import json
import os
import resource
import shutil
import signal
import tempfile

from dfltest import SOURCE, Tally, dfl, st_read_raw, st_write_raw

t = Tally("integrity")
tmp = tempfile.mkdtemp(prefix="dfl-integrity-")
ET, ED = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
PROMPTS = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
ARGS = ["--target", ET, "--drafter", ED, "--progress", "none", "--cost-reps", 0]
KEEP = ("tokens", "rounds", "drafted", "accepted", "accept_hist", "pos_drafted", "pos_accepted", "output_ids")


def path(*p):
    return os.path.join(tmp, *p)


def lines(d, name="results.jsonl"):
    with open(os.path.join(d, name)) as f:
        return [json.loads(x) for x in f if x.strip()]


def keyed(rs):
    return {(r["prompt_id"], r["turn"], r["drafter"], r["mode"], r["method"]): tuple(json.dumps(r.get(k)) for k in KEEP)
            for r in rs}


def file_limit(nbytes):
    """preexec_fn: files may not grow past nbytes (a full disk, deterministically)."""
    def f():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return f


def evalrun(out, *extra, check=True, **kw):
    return dfl("eval", *ARGS, "--prompts", PROMPTS, "--out", out, *extra, check=check, **kw)


# ---- 1: a partial last line of any length is cut before a resume appends ----

def resume_partial_tail():
    base = path("base")
    evalrun(base, "--limit", 3, "--max-new", 24)
    want = keyed(lines(base))
    text = open(os.path.join(base, "results.jsonl")).read()
    first = text[: text.index("\n") + 1]
    for i, tail in enumerate(("{", "{\"", "x", " ", "{\"prompt_id\": \"0\"")):
        out = path(f"partial-{i}")
        os.makedirs(out)
        with open(os.path.join(out, "results.jsonl"), "w") as f:
            f.write(first + tail)  # an interrupted write: a partial line of len(tail) bytes
        p = evalrun(out, "--limit", 3, "--max-new", 24, "--resume", check=False)
        t.check(p.returncode == 0, f"partial tail {tail!r}: --resume: {p.stderr[-300:]}")
        raw = open(os.path.join(out, "results.jsonl")).read()
        t.check(raw.endswith("\n") and all(json.loads(x) for x in raw.splitlines()),
                f"partial tail {tail!r}: every line is a JSON object")
        t.check(keyed(lines(out)) == want and len(lines(out)) == len(want),
                f"partial tail {tail!r}: the resumed results equal an uninterrupted run")
        p = evalrun(out, "--limit", 3, "--max-new", 24, "--resume", check=False)
        t.check(p.returncode == 0, f"partial tail {tail!r}: a second --resume: {p.stderr[-300:]}")


def resume_after_full_disk():
    """A write cut by a full disk (any length: here the size limit falls inside the second line) is
    cut away by the next --resume."""
    base = path("base")
    size = len(open(os.path.join(base, "results.jsonl")).read().splitlines()[0]) + 2
    out = path("fsize")
    p = evalrun(out, "--limit", 3, "--max-new", 24, check=False, preexec_fn=file_limit(size))
    t.check(p.returncode != 0 and "results.jsonl" in p.stderr, f"a full disk is an error naming the file: {p.stderr[-300:]}")
    t.check(os.path.getsize(os.path.join(out, "results.jsonl")) == size, "the limit left a partial line")
    p = evalrun(out, "--limit", 3, "--max-new", 24, "--resume", check=False)
    t.check(p.returncode == 0 and keyed(lines(out)) == keyed(lines(base)),
            f"resumed after the full disk: {p.stderr[-300:]}")


# ---- 3: a saved-features file whose fields disagree is refused, naming the file and fields ----

def saved_features():
    feat = path("feat")
    evalrun(path("feat-run"), "--limit", 2, "--max-new", 128, "--save-features", feat)
    man = [json.loads(x) for x in open(os.path.join(feat, "manifest.jsonl"))]
    eos = [m for m in man if m["tokens"] < 128]
    t.check(len(eos) > 0, f"a truth that stops at an eos before --max-new: {man}")
    name = eos[0]["file"]
    p = dfl("eval", "--features", feat, "--drafter", ED, "--out", path("feat-ok"), "--progress", "none", check=False)
    t.check(p.returncode == 0, f"the saved features replay: {p.stderr[-300:]}")
    cases = [("stop max_new with fewer tokens", {"stop": "max_new"}, "stop max_new"),
             ("stop neither eos nor max_new", {"stop": "length"}, "stop"),
             ("more tokens than max_new", {"max_new": str(eos[0]["tokens"] - 1)}, "exceeds max_new")]
    for i, (what, edit, needle) in enumerate(cases):
        bad = path(f"feat-bad{i}")
        shutil.copytree(feat, bad)
        f = os.path.join(bad, name)
        _, hdr, data = st_read_raw(f)
        hdr["__metadata__"].update(edit)
        st_write_raw(f, hdr, data)
        p = dfl("eval", "--features", bad, "--drafter", ED, "--out", path(f"feat-bad{i}-out"), "--progress", "none",
                check=False)
        t.check(p.returncode != 0 and name in p.stderr and needle in p.stderr, f"{what}: refused: {p.stderr[-300:]}")
    # the manifest and the file disagree on the tokens
    bad = path("feat-bad-manifest")
    shutil.copytree(feat, bad)
    with open(os.path.join(bad, "manifest.jsonl"), "w") as f:
        for m in man:
            f.write(json.dumps(dict(m, tokens=m["tokens"] - 1) if m["file"] == name else m) + "\n")
    p = dfl("eval", "--features", bad, "--drafter", ED, "--out", path("feat-bad-manifest-out"), "--progress", "none",
            check=False)
    t.check(p.returncode != 0 and name in p.stderr and "manifest.jsonl says" in p.stderr,
            f"manifest tokens disagreeing with the file: refused: {p.stderr[-300:]}")
    return feat


# ---- 5: reports are replaced whole: a failed write leaves the previous ones intact ----

REPORTS = ("summary.json", "summary.md", "per_position.svg", "tau_hist.svg", "tau_budget.svg")


def reports_whole():
    out = path("reports")
    evalrun(out, "--limit", 2, "--max-new", 24, "--tree-budget", "0,4")
    before = {n: open(os.path.join(out, n), "rb").read() for n in REPORTS}
    t.check(all(len(v) > 1000 for v in before.values()), f"reports written: {[len(v) for v in before.values()]}")
    # a resumed run that has nothing to add rewrites the reports; the disk is full at 1000 bytes
    p = evalrun(out, "--limit", 2, "--max-new", 24, "--tree-budget", "0,4", "--resume", check=False,
                preexec_fn=file_limit(1000))
    t.check(p.returncode != 0 and "summary.json" in p.stderr, f"the failed report write is an error: {p.stderr[-300:]}")
    after = {n: open(os.path.join(out, n), "rb").read() for n in REPORTS}
    t.check(after == before, f"the previous reports are intact: sizes {[len(v) for v in after.values()]}")
    t.check(not [n for n in os.listdir(out) if n.endswith(".tmp")], f"no temporary file left: {os.listdir(out)}")
    p = evalrun(out, "--limit", 2, "--max-new", 24, "--tree-budget", "0,4", "--resume", check=False)
    t.check(p.returncode == 0 and json.load(open(os.path.join(out, "summary.json")))["prompts"] == 2,
            f"with room again the reports are rewritten: {p.stderr[-300:]}")


# ---- 4: one run per features directory; a directory a failed recording left incomplete says so ----

def features_dir_guarded():
    feat = path("feat4")
    evalrun(path("feat4-run"), "--limit", 2, "--max-new", 16, "--save-features", feat)
    manifest = open(os.path.join(feat, "manifest.jsonl")).read()
    t.check(json.load(open(os.path.join(feat, "target.json"))).get("complete") is True, "a finished recording: complete")
    # another eval saving into it while the first holds it: refused before writing
    with open(os.path.join(feat, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        p = evalrun(path("feat4-second"), "--limit", 2, "--max-new", 16, "--save-features", feat, "--resume",
                    check=False)
    t.check(p.returncode != 0 and "another dfl eval" in p.stderr and feat in p.stderr,
            f"a second eval saving into a locked features directory is refused: {p.stderr[-300:]}")
    # without --resume an existing manifest is not started over
    p = evalrun(path("feat4-third"), "--limit", 2, "--max-new", 16, "--save-features", feat, check=False)
    t.check(p.returncode != 0 and "already lists 2 saved truths" in p.stderr and "--resume" in p.stderr,
            f"a recording over an existing manifest needs --resume: {p.stderr[-300:]}")
    t.check(open(os.path.join(feat, "manifest.jsonl")).read() == manifest, "the manifest is intact")
    # a manifest line that is two objects run together (two writers once did this) is refused by line
    bad = path("feat4-joined")
    shutil.copytree(feat, bad)
    lines_ = manifest.splitlines()
    with open(os.path.join(bad, "manifest.jsonl"), "w") as f:
        f.write(lines_[0] + "\n" + lines_[1] + lines_[0][:20] + "\n")
    p = dfl("eval", "--features", bad, "--drafter", ED, "--out", path("feat4-joined-out"), "--progress", "none",
            check=False)
    t.check(p.returncode != 0 and "manifest.jsonl:2" in p.stderr, f"joined manifest line refused: {p.stderr[-300:]}")


def features_incomplete():
    """A recording that fails after its first prompt (the disk fills at the second's features file)
    leaves target.json complete false; a --features run over it scores what is there, writes the
    reports, says what is missing and fails."""
    prompts = path("two-prompts.jsonl")
    long_q = " ".join(["Please explain step by step how many apples remain after each trade."] * 12)
    with open(prompts, "w") as f:
        f.write(json.dumps({"question": "Hi"}) + "\n" + json.dumps({"question": long_q}) + "\n")
    full = path("feat5-full")
    dfl("eval", *ARGS, "--prompts", prompts, "--max-new", 8, "--out", path("feat5-full-run"), "--save-features", full)
    sizes = sorted(os.path.getsize(os.path.join(full, n)) for n in os.listdir(full) if n.endswith(".safetensors"))
    t.check(len(sizes) == 2 and sizes[1] > sizes[0] + 20000, f"the second truth's file is the larger: {sizes}")
    feat = path("feat5")
    p = dfl("eval", *ARGS, "--prompts", prompts, "--max-new", 8, "--out", path("feat5-run"), "--save-features", feat,
            check=False, preexec_fn=file_limit(sizes[0] + 10000))
    t.check(p.returncode != 0 and "00001-t0" in p.stderr, f"the recording fails at the second file: {p.stderr[-300:]}")
    t.check(json.load(open(os.path.join(feat, "target.json"))).get("complete") is False, "target.json: complete false")
    out = path("feat5-replay")
    p = dfl("eval", "--features", feat, "--drafter", ED, "--out", out, "--progress", "none", check=False)
    t.check(p.returncode != 0 and "did not finish" in p.stderr and "lists 1 saved truths" in p.stderr,
            f"a --features run over an incomplete directory says so: {p.stderr[-400:]}")
    s = json.load(open(os.path.join(out, "summary.json")))
    t.check(s["prompts"] == 1 and "did not finish" in s.get("incomplete", ""), f"summary.json says incomplete: {s.get('incomplete')}")
    # completed with --resume: complete again, and the replay is whole
    dfl("eval", *ARGS, "--prompts", prompts, "--max-new", 8, "--out", path("feat5-run"), "--save-features", feat,
        "--resume")
    t.check(json.load(open(os.path.join(feat, "target.json"))).get("complete") is True, "resumed recording: complete")
    p = dfl("eval", "--features", feat, "--drafter", ED, "--out", path("feat5-replay2"), "--progress", "none",
            check=False)
    t.check(p.returncode == 0 and json.load(open(os.path.join(path("feat5-replay2"), "summary.json")))["prompts"] == 2,
            f"the completed directory replays whole: {p.stderr[-300:]}")


t.run(resume_partial_tail)
t.run(resume_after_full_disk)
t.run(saved_features)
t.run(reports_whole)
t.run(features_dir_guarded)
t.run(features_incomplete)
t.done()
