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
    first = open(os.path.join(base, "results.jsonl")).read().splitlines()
    # inside the second line, and past run.json's size (written whole before any result)
    size = max(len(first[0]) + 2, os.path.getsize(os.path.join(base, "run.json")) + 1)
    t.check(size < len(first[0]) + 1 + len(first[1]), f"a limit of {size} bytes falls inside the second line")
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


# ---- 6: prompt files: NUL characters, prompts past the target's positions, a 10 MB line ----

def write_prompts(name, raw_lines):
    f = path(name)
    with open(f, "wb") as fh:
        fh.write(b"".join(x + b"\n" for x in raw_lines))
    return f


def prompt_files():
    ok = json.dumps({"question": "What is 2 + 3?"}).encode()
    cases = [
        ("an escaped NUL in the question", b'{"question": "a\\u0000b"}', "field 'question' holds a NUL character"),
        ("a raw NUL byte", b'{"question": "a"}\x00{"x": 1}', "NUL byte at column 18"),
        ("a NUL in a second turn", b'{"question_id": 5, "turns": ["a", "b\\u0000"]}', "turns[1] holds a NUL"),
        ("text after the object", b'{"question": "a"} {"question": "b"}', "text after the JSON object at column 19"),
        ("a NUL in a key", b'{"question": "a", "id\\u0000x": 3}', "key 'id' holds a NUL character"),
    ]
    for i, (what, line, needle) in enumerate(cases):
        fmt = ["--format", "mtbench"] if b"turns" in line else []
        f = write_prompts(f"nul{i}.jsonl", [b'{"question_id": 4, "turns": ["x"]}' if fmt else ok, line])
        p = dfl("eval", *ARGS, "--prompts", f, *fmt, "--max-new", 4, "--out", path(f"nul{i}-out"), check=False)
        t.check(p.returncode != 0 and f"{f}:2" in p.stderr and needle in p.stderr, f"{what}: {p.stderr[-300:]}")
        p = dfl("eval", "--dump-prompts", path(f"nul{i}.dump"), "--tokenizer", ET, "--prompts", f, *fmt, check=False)
        t.check(p.returncode != 0 and needle in p.stderr, f"{what}, --dump-prompts: {p.stderr[-300:]}")
    # a NUL in a field that is not read is no prompt's business; the escaped backslash is no NUL
    f = write_prompts("nul-ok.jsonl", [b'{"question": "a\\\\u0000b", "answer": "x\\u0000"}'])
    dump = path("nul-ok.dump")
    dfl("eval", "--dump-prompts", dump, "--tokenizer", ET, "--prompts", f)
    t.check(json.loads(open(dump).readline())["user"] == "a\\u0000b", "an escaped backslash before u0000 is text")
    # a text-format line with a NUL byte
    f = write_prompts("nul.txt", [b"first", b"sec\x00ond"])
    p = dfl("eval", *ARGS, "--prompts", f, "--format", "text", "--max-new", 4, "--out", path("nul-txt"), check=False)
    t.check(p.returncode != 0 and f"{f}:2" in p.stderr and "NUL byte at column 4" in p.stderr,
            f"text format NUL byte: {p.stderr[-300:]}")
    # --keep-going skips such lines and lists them
    f = write_prompts("nul-kg.jsonl", [ok, cases[0][1], ok.replace(b"2 + 3", b"4 + 4")])
    out = path("nul-kg")
    dfl("eval", *ARGS, "--prompts", f, "--max-new", 4, "--keep-going", "--out", out)
    s = json.load(open(os.path.join(out, "summary.json")))
    t.check(s["run"]["bad_prompt_lines"] == [2] and s["prompts"] == 2, f"--keep-going: {s['run']['bad_prompt_lines']}")


def prompt_positions():
    words = " ".join(["apple banana computing speculative decode"] * 2_000_000)  # 10 MB on one line
    f = path("huge.jsonl")
    with open(f, "w") as fh:
        fh.write(json.dumps({"question": "Hi"}) + "\n" + json.dumps({"question": words}) + "\n")
    out = path("huge-out")
    p = dfl("eval", *ARGS, "--prompts", f, "--max-new", 8, "--out", out, check=False)
    t.check(p.returncode != 0 and f"{f}:2: prompt 2:" in p.stderr and "max_position_embeddings 4096" in p.stderr,
            f"a 10 MB prompt is refused before any work: {p.stderr[-300:]}")
    res = os.path.join(out, "results.jsonl")
    t.check(not os.path.exists(res) or os.path.getsize(res) == 0, "nothing was run")
    # just past the positions: prompt tokens + --max-new > 4096
    long_q = " ".join(["apple"] * 3000)
    f = path("long.jsonl")
    with open(f, "w") as fh:
        fh.write(json.dumps({"question": long_q}) + "\n")
    n = len(dfl("tokenize", "--tokenizer", ET, "--text", long_q).stdout.split())
    p = dfl("eval", *ARGS, "--prompts", f, "--chat", "none", "--max-new", 4097 - n, "--out", path("long-out"),
            check=False)
    t.check(p.returncode != 0 and f"{n} prompt tokens + --max-new {4097 - n} = 4097 positions" in p.stderr,
            f"one position too many is refused: {p.stderr[-300:]}")
    p = dfl("eval", *ARGS, "--prompts", f, "--chat", "none", "--max-new", min(4096 - n, 8), "--out",
            path("long-out2"), check=False)
    t.check(p.returncode == 0, f"within the positions it runs: {p.stderr[-300:]}")
    # a second turn past them (its length is known once the first is answered): refused naming the turn
    f = path("long-mtb.jsonl")
    with open(f, "w") as fh:
        fh.write(json.dumps({"question_id": 1, "turns": ["Hi", long_q + " " + long_q]}) + "\n")
    p = dfl("eval", *ARGS, "--prompts", f, "--format", "mtbench", "--max-new", 8, "--out", path("long-mtb-out"),
            check=False)
    t.check(p.returncode != 0 and "prompt 1 turn 2:" in p.stderr and "max_position_embeddings 4096" in p.stderr,
            f"a second turn past the positions: {p.stderr[-300:]}")


# ---- 8: prompt ids are what the file says, or the line number when it has none ----

def prompt_ids():
    for i, (idv, needle) in enumerate(((1.5, "found 1.5"), (None, "found null"), ({}, "found {}"),
                                       (True, "found true"), (1e300, "found 1e+300"))):
        f = write_prompts(f"id{i}.jsonl", [json.dumps({"question": "a", "id": idv}).encode()])
        p = dfl("eval", *ARGS, "--prompts", f, "--max-new", 4, "--out", path(f"id{i}-out"), check=False)
        t.check(p.returncode != 0 and f"{f}:1" in p.stderr and "field 'id': a prompt id must be a string or an integer"
                in p.stderr and needle in p.stderr, f"id {idv!r}: {p.stderr[-300:]}")
    f = write_prompts("id-ok.jsonl", [json.dumps({"question": "a", "id": 7}).encode(),
                                      json.dumps({"question": "b", "idx": "x"}).encode(),
                                      json.dumps({"question": "c"}).encode()])
    dump = path("id-ok.dump")
    dfl("eval", "--dump-prompts", dump, "--tokenizer", ET, "--prompts", f)
    ids = [json.loads(x)["prompt_id"] for x in open(dump)]
    t.check(ids == ["7", "x", "3"], f"integer, string and absent ids: {ids}")


# ---- 8: messages that name the file at fault; no report beside results it does not describe ----

def features_messages(feat):
    man = [json.loads(x) for x in open(os.path.join(feat, "manifest.jsonl"))]
    name = man[-1]["file"]
    # NaN in a pipeline's features: the pipeline file and the position are named
    pipe = path("pipe-nan")
    shutil.copytree(feat, pipe)
    f = os.path.join(pipe, name)
    _, hdr, data = st_read_raw(f)
    layer = sorted(k for k in hdr if k.startswith("layer."))[0]
    H = hdr[layer]["shape"][1]
    o = hdr[layer]["data_offsets"][0] + 4 * H * 10 + 4 * 3
    data = data[:o] + b"\x00\x00\xc0\x7f" + data[o + 4:]
    st_write_raw(f, hdr, data)
    p = dfl("eval", "--features", feat, "--features-from", pipe, "--drafter", ED, "--out", path("pipe-nan-out"),
            "--progress", "none", check=False)
    t.check(p.returncode != 0 and f"{f}: {layer} position 10 column 3 is NaN" in p.stderr,
            f"NaN in the pipeline's features names file, layer and position: {p.stderr[-300:]}")
    # a 3-D layer tensor is reported with its three dimensions
    bad = path("feat-3d")
    shutil.copytree(feat, bad)
    f = os.path.join(bad, name)
    _, hdr, data = st_read_raw(f)
    rows = hdr[layer]["shape"][0]
    hdr[layer]["shape"] = [rows, 1, H]
    st_write_raw(f, hdr, data)
    p = dfl("eval", "--features", bad, "--drafter", ED, "--out", path("feat-3d-out"), "--progress", "none", check=False)
    t.check(p.returncode != 0 and f"found F32 [{rows}, 1, {H}]" in p.stderr, f"3-D tensor: {p.stderr[-300:]}")


def stale_summary():
    """A resumed run that adds prompts and fails (a full disk) leaves no summary of the earlier,
    smaller run beside results.jsonl; a resume that completes writes the whole one."""
    out = path("stale")
    evalrun(out, "--limit", 2, "--max-new", 24)
    size = os.path.getsize(os.path.join(out, "results.jsonl"))
    p = evalrun(out, "--limit", 4, "--max-new", 24, "--resume", check=False, preexec_fn=file_limit(size + 50))
    t.check(p.returncode != 0, f"the resumed run fails at the full disk: {p.stderr[-200:]}")
    t.check(not [n for n in REPORTS if os.path.exists(os.path.join(out, n))],
            f"no report of the earlier run is left: {sorted(os.listdir(out))}")
    evalrun(out, "--limit", 4, "--max-new", 24, "--resume")
    t.check(json.load(open(os.path.join(out, "summary.json")))["prompts"] == 4, "the completed run's summary")
    # a resume with nothing to add keeps them (rewritten whole)
    before = open(os.path.join(out, "summary.md")).read()
    evalrun(out, "--limit", 4, "--max-new", 24, "--resume")
    t.check(open(os.path.join(out, "summary.md")).read().split("\n")[0] == before.split("\n")[0], "kept")


# ---- 2: eval-merge and eval-compare judge runs by what they ran ----

def shard(name, i, n, *extra, prompts=PROMPTS, limit=4):
    out = path(name)
    dfl("eval", *ARGS, "--prompts", prompts, "--limit", limit, "--max-new", 16, "--shard", f"{i}/{n}", "--out", out,
        *extra)
    return out


def merge_checks():
    s0, s1 = shard("m-s0", 0, 2), shard("m-s1", 1, 2)
    n0 = len(lines(s0))
    whole = path("m-whole")
    evalrun(whole, "--limit", 4, "--max-new", 16)
    merged = path("m-merged")
    dfl("eval-merge", "--out", merged, s0, s1)
    t.check(keyed(lines(merged)) == keyed(lines(whole)), "merged shards: the results of one run")
    sm, sw = (json.load(open(os.path.join(d, "summary.json"))) for d in (merged, whole))
    t.check(sm.get("run", {}).get("prompt_set") == sw["run"].get("prompt_set") is not None, "merged prompt set")
    t.check(open(os.path.join(merged, "results.jsonl")).read() ==
            open(os.path.join(s0, "results.jsonl")).read() + open(os.path.join(s1, "results.jsonl")).read(),
            "the inputs' lines as they are (round_lengths and all)")
    # --out is an input, under any spelling: refused before anything is written
    for spelled in (s0, s0 + "/", os.path.join(os.path.dirname(s0), ".", "m-s0")):
        p = dfl("eval-merge", "--out", spelled, s0, s1, check=False)
        t.check(p.returncode == 2 and "never writes into an input" in p.stderr, f"--out {spelled}: {p.stderr[-300:]}")
        t.check(len(lines(s0)) == n0, f"--out {spelled}: the input keeps its {n0} lines ({len(lines(s0))})")
    # an input given twice: refused, nothing written
    out = path("m-twice")
    p = dfl("eval-merge", "--out", out, s0, s0 + "/", check=False)
    t.check(p.returncode == 2 and "same directory" in p.stderr and not os.path.exists(out),
            f"a repeated input: {p.stderr[-300:]}")
    # other options: refused naming the option, nothing written
    for name, extra, needle in (("m-maxnew", ["--max-new", 12], "max_new 16 vs 12"),
                                ("m-chat", ["--chat", "none"], 'chat "chatml" vs "none"'),
                                ("m-online", ["--online"], 'method "replay" vs "online"')):
        o = path(name)
        dfl("eval", *ARGS, "--prompts", PROMPTS, "--limit", 4, "--max-new", 16, "--shard", "1/2", "--out", o, *extra)
        out = path(name + "-merged")
        p = dfl("eval-merge", "--out", out, s0, o, check=False)
        t.check(p.returncode == 1 and "ran with other options" in p.stderr and needle in p.stderr and
                not os.path.exists(out), f"{extra}: {p.stderr[-300:]}")
    # other prompts under the same ids: refused naming the prompt
    edited = path("edited.jsonl")
    src = open(PROMPTS).read().splitlines()
    with open(edited, "w") as f:
        f.write("\n".join(src[:1] + [json.dumps(dict(json.loads(src[1]), question="Something else entirely."))]
                          + src[2:]) + "\n")
    e1 = shard("m-edited", 1, 2, prompts=edited)
    p = dfl("eval-merge", "--out", path("m-edited-merged"), s0, e1, check=False)
    t.check(p.returncode != 0 and "ran on other prompt files" in p.stderr, f"a shard of an edited file: {p.stderr[-300:]}")
    e2 = shard("m-edited-all", 0, 1, prompts=edited)  # every prompt: prompt 2 is in both, with other texts
    legacy_all = json.load(open(os.path.join(e2, "run.json")))
    del legacy_all["all_prompts"]
    json.dump(legacy_all, open(os.path.join(e2, "run.json"), "w"))
    p = dfl("eval-merge", "--out", path("m-edited-merged2"), s1, e2, check=False)
    t.check(p.returncode != 0 and "prompt 2 is another prompt" in p.stderr, f"an edited prompt: {p.stderr[-300:]}")
    s1b = shard("m-s1-limit6", 1, 2, limit=6)
    p = dfl("eval-merge", "--out", path("m-limit-merged"), s0, s1b, check=False)
    t.check(p.returncode != 0 and "ran on other prompt files" in p.stderr, f"shards of other --limit: {p.stderr[-300:]}")
    # overlapping inputs: the same results are kept once, other results are refused naming both
    dup = path("m-dup")
    shutil.copytree(s0, dup)
    out = path("m-dup-merged")
    p = dfl("eval-merge", "--out", out, s0, dup, s1, check=False)
    t.check(p.returncode == 0 and keyed(lines(out)) == keyed(lines(whole)) and len(lines(out)) == len(lines(whole))
            and "kept once" in p.stderr, f"an overlapping copy is kept once: {p.stderr[-300:]}")
    bad = path("m-dup-bad")
    shutil.copytree(s0, bad)
    rs = open(os.path.join(bad, "results.jsonl")).read().splitlines()
    r = json.loads(rs[-1])
    r["rounds"] += 1
    rs[-1] = json.dumps(r)
    open(os.path.join(bad, "results.jsonl"), "w").write("\n".join(rs) + "\n")
    p = dfl("eval-merge", "--out", path("m-dup-bad-merged"), s0, bad, check=False)
    t.check(p.returncode == 1 and f"{bad}/results.jsonl:{len(rs)}" in p.stderr and "other results" in p.stderr,
            f"overlapping runs that disagree: {p.stderr[-300:]}")
    # a run made before run.json existed: its summary.json's run is what it ran
    legacy = path("m-legacy")
    shutil.copytree(s1, legacy)
    os.remove(os.path.join(legacy, "run.json"))
    p = dfl("eval-merge", "--out", path("m-legacy-merged"), s0, legacy, check=False)
    t.check(p.returncode == 0, f"an input without run.json: {p.stderr[-300:]}")
    os.remove(os.path.join(legacy, "summary.json"))
    p = dfl("eval-merge", "--out", path("m-legacy-merged2"), s0, legacy, check=False)
    t.check(p.returncode == 1 and "cannot tell what this run ran" in p.stderr, f"neither: {p.stderr[-300:]}")
    # a merge of chain-only runs over an earlier merge with tree modes: no stale tau_budget.svg
    t1 = path("m-tree")
    evalrun(t1, "--limit", 2, "--max-new", 16, "--tree-budget", "0,4")
    out = path("m-reused")
    dfl("eval-merge", "--out", out, t1)
    t.check(os.path.exists(os.path.join(out, "tau_budget.svg")), "tree modes: tau_budget.svg")
    dfl("eval-merge", "--out", out, s0, s1)
    t.check(not os.path.exists(os.path.join(out, "tau_budget.svg")), "chain only: the earlier tau_budget.svg is gone")


def resume_checks():
    out = path("r-opts")
    evalrun(out, "--limit", 2, "--max-new", 16)
    p = evalrun(out, "--limit", 2, "--max-new", 20, "--resume", check=False)
    t.check(p.returncode != 0 and "run.json" in p.stderr and "max_new 16 vs 20" in p.stderr,
            f"a resume with another --max-new: {p.stderr[-300:]}")
    edited = path("edited.jsonl")
    p = dfl("eval", *ARGS, "--prompts", edited, "--limit", 3, "--max-new", 16, "--out", out, "--resume", check=False)
    t.check(p.returncode != 0 and "prompt 2 is not the prompt of that id" in p.stderr,
            f"a resume over an edited prompt: {p.stderr[-300:]}")
    p = evalrun(out, "--limit", 3, "--max-new", 16, "--resume", check=False)
    t.check(p.returncode == 0 and sorted(json.load(open(os.path.join(out, "run.json")))["prompts"]) == ["1", "2", "3"],
            f"a resume with more prompts: {p.stderr[-300:]}")


def compare_checks():
    s0, s1 = path("m-s0"), path("m-s1")
    p = dfl("eval-compare", s0, s1, check=False)
    t.check(p.returncode == 1 and "ran other prompts" in p.stderr, f"shards of other prompts: {p.stderr[-300:]}")
    # the same prompts file under another path (a copy) is the same prompts
    copy = path("copy-of-prompts.jsonl")
    shutil.copy(PROMPTS, copy)
    a, b = path("c-a"), path("c-b")
    evalrun(a, "--limit", 3, "--max-new", 16)
    dfl("eval", *ARGS, "--prompts", copy, "--limit", 3, "--max-new", 16, "--out", b)
    p = dfl("eval-compare", a, b, check=False)
    t.check(p.returncode == 0 and "+0.0%" in p.stdout, f"the same prompts by another path: {p.stderr[-300:]}")
    # an edited prompt under the same id is another prompt set
    c = path("c-c")
    dfl("eval", *ARGS, "--prompts", path("edited.jsonl"), "--limit", 3, "--max-new", 16, "--out", c)
    p = dfl("eval-compare", a, c, check=False)
    t.check(p.returncode == 1 and "ran other prompts" in p.stderr, f"an edited prompt: {p.stderr[-300:]}")


t.run(resume_partial_tail)
t.run(resume_after_full_disk)
feat_ = None
try:
    feat_ = saved_features()
except Exception as e:  # noqa: BLE001
    t.check(False, f"saved_features: {e}")
if feat_:
    t.run(features_messages, feat_)
t.run(stale_summary)
t.run(reports_whole)
t.run(features_dir_guarded)
t.run(features_incomplete)
t.run(merge_checks)
t.run(resume_checks)
t.run(compare_checks)
t.run(prompt_files)
t.run(prompt_positions)
t.run(prompt_ids)
t.done()
