"""`mpirun -n N dfl eval` (docs/eval.md, "Across machines: MPI") on localhost: results identical to
one process per response (tokens, rounds, tau, output ids) in replay (--check-ar), online with
MT-Bench's two turns, and replay from saved features; a rank killed mid-run (the test hook
DFL_TEST_MPI_EXIT=RANK:LINES makes that rank _exit after sending LINES results lines) with
--enable-recovery (the others finish, rank 0 writes what it has, names the missing prompt in its
message and in summary.json) and without it (mpirun ends the job), each followed by --resume under
mpirun giving the same summary as one process; refusals. Skipped only when mpirun is absent."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from dfltest import DATA, DFL, SOURCE, Tally, dfl, fixture

MPIRUN = shutil.which("mpirun")
if not MPIRUN:
    print("[mpi] skipped: mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev; "
          "scripts/install-deps.sh does)", flush=True)
    sys.exit(0)

t = Tally("mpi")
tmp = tempfile.mkdtemp(prefix="dfl-mpi-")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_rmaps_base_oversubscribe": "1"}
TGT, DRF = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
GSM40 = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
MTB = os.path.join(DATA, "datasets", "mt_bench", "question.jsonl")
REPLAY = ["--target", TGT, "--drafter", DRF, "--prompts", GSM40, "--limit", "7", "--max-new", "32",
          "--tree-budget", "0,4", "--check-ar", "--progress", "lines"]


def mpirun(n, *args, extra=(), env=None, timeout=120):
    cmd = [MPIRUN, "--oversubscribe", *extra, "-n", str(n), DFL, "eval", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env or ENV, timeout=timeout)


def mpirun_slow_others(n, victim, *args, extra=(), env=None, timeout=120):
    """n ranks of which every one but `victim` first measures its costs at length (--cost-reps 100):
    the victim, whose death the test hook arranges, then surely gets a unit to die in, however the
    machine's load schedules the processes."""
    cmd = [MPIRUN, "--oversubscribe", *extra]
    for r in range(n):
        cmd += [":"] if r else []
        cmd += ["-n", "1", DFL, "eval", *map(str, args)] + ([] if r == victim else ["--cost-reps", "100"])
    return subprocess.run(cmd, capture_output=True, text=True, env=env or ENV, timeout=timeout)


def lines(d):
    with open(os.path.join(d, "results.jsonl")) as f:
        return [json.loads(x) for x in f if x.strip()]


def per_response(d):
    """Every response once, keyed; the figures that must not depend on the process count."""
    out = {}
    for r in lines(d):
        k = (r["prompt_id"], r["turn"], r["drafter"], r["mode"], r["method"], r["features"])
        t.check(k not in out, f"{d}: response {k} once")
        out[k] = (r["tokens"], r["rounds"], r["tau"], r["drafted"], r["accepted"], r.get("output_ids"))
    return out


def comparable(d):
    s = json.load(open(os.path.join(d, "summary.json")))
    keep = ("drafter", "mode", "responses", "tokens", "rounds", "drafted", "accepted", "tau", "tau_token_weighted",
            "per_position", "accept_hist", "mismatches")
    return s["prompts"], sorted(tuple(json.dumps(r[k]) for k in keep) for r in s["results"])


def same(a, b, what):
    ra, rb = per_response(a), per_response(b)
    t.check(ra == rb, f"{what}: {len(rb)} responses identical to one process ({len(ra)}): "
                      f"{sorted(set(ra) ^ set(rb))[:4]}")
    t.check(comparable(a) == comparable(b), f"{what}: summary equal to one process's")


one = os.path.join(tmp, "one")
dfl("eval", *REPLAY, "--out", one, env=ENV)


def version():
    v = dfl("--version").stdout
    t.check("mpi Open MPI" in v, f"dfl --version names the MPI it was built with: {v.splitlines()[-1]}")


def replay_identical():
    out = os.path.join(tmp, "two")
    p = mpirun(2, *REPLAY, "--out", out)
    t.check(p.returncode == 0, f"mpirun -n 2 exit {p.returncode}: {p.stderr[-800:]}")
    t.check("MPI: 2 ranks" in p.stderr and "7/7" in p.stderr, "rank 0 announces the ranks and shows every prompt")
    same(one, out, "replay, -n 2")
    t.check(sorted(os.listdir(out)) == sorted(os.listdir(one)), f"the same files as one process: {os.listdir(out)}")


def online_mtbench():
    args = ["--online", "--target", fixture("qwen3_tiny"), "--drafter", fixture("dflash_qwen3"), "--prompts", MTB,
            "--limit", "3", "--max-new", "8", "--tree-budget", "0,4", "--progress", "none"]
    a, b = os.path.join(tmp, "mtb1"), os.path.join(tmp, "mtb3")
    dfl("eval", *args, "--out", a, env=ENV)
    p = mpirun(3, *args, "--out", b)
    t.check(p.returncode == 0, f"online MT-Bench -n 3: {p.stderr[-800:]}")
    t.check(any(r["turn"] == 1 for r in lines(b)), "second turns ran")
    same(a, b, "online MT-Bench both turns, -n 3")


def features():
    """Replay from saved features: the drafter x budget work spread over ranks."""
    feat, a, b = (os.path.join(tmp, x) for x in ("feat", "feat1", "feat2"))
    dfl("eval", "--target", TGT, "--drafter", DRF, "--prompts", GSM40, "--limit", "4", "--max-new", "32",
        "--save-features", feat, "--out", os.path.join(tmp, "featrec"), "--progress", "none", env=ENV)
    args = ["--features", feat, "--drafter", DRF, "--tree-budget", "0,2,8", "--progress", "none"]
    dfl("eval", *args, "--out", a, env=ENV)
    p = mpirun(2, *args, "--out", b)
    t.check(p.returncode == 0, f"--features -n 2: {p.stderr[-800:]}")
    same(a, b, "--features, -n 2")


def killed_recovery():
    """--enable-recovery: rank 1 dies after its first line (its first prompt, a quarter written);
    rank 0 and 2 run the rest; rank 0 writes the reports, names the missing prompt; --resume
    completes it."""
    out = os.path.join(tmp, "killed")
    p = mpirun_slow_others(3, 1, *REPLAY, "--out", out, extra=["--enable-recovery", "-x", "DFL_TEST_MPI_EXIT"],
                           env={**ENV, "DFL_TEST_MPI_EXIT": "1:1"})
    err = p.stderr
    t.check("rank 1 (host" in err and "died running prompt" in err, f"the death is named: {err[-600:]}")
    t.check("prompt(s) missing" in err and "--resume" in err, "rank 0 names the missing prompts")
    s = json.load(open(os.path.join(out, "summary.json")))
    t.check("incomplete" in s and "missing" in s["incomplete"], f"summary.json says it is incomplete: {s.get('incomplete')}")
    missing = s["incomplete"].split(": ", 1)[1].split(";")[0].split(", ")
    per = {}
    for r in lines(out):
        per[r["prompt_id"]] = per.get(r["prompt_id"], 0) + 1
    got = {k for k, v in per.items() if v == 4}  # ar, the recording run, chain and ddtree-4 replays
    t.check(len(missing) == 1 and len(got) == 6 and missing[0] not in got and per.get(missing[0]) == 1,
            f"one prompt missing ({missing}, 1 line of 4 sent before the death), the other six complete ({per})")
    # the resume: rank 0 measures its costs at length (--cost-reps 100), so rank 1 most likely takes
    # the missing prompt with the line rank 0 hands over with it (each response once either way)
    p = subprocess.run([MPIRUN, "--oversubscribe", "-n", "1", DFL, "eval", *REPLAY, "--out", out, "--resume",
                        "--cost-reps", "100", ":", "-n", "1", DFL, "eval", *REPLAY, "--out", out, "--resume"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    t.check(p.returncode == 0 and "1/7" not in p.stderr, f"--resume: {p.stderr[-600:]}")
    t.check("incomplete" not in json.load(open(os.path.join(out, "summary.json"))), "complete after --resume")
    same(one, out, "killed with --enable-recovery, then --resume")


def killed_default():
    """Without --enable-recovery mpirun ends the job when a rank dies: exit status non-zero, every
    line rank 0 received is in results.jsonl, --resume completes the run."""
    out = os.path.join(tmp, "killed2")
    p = mpirun_slow_others(2, 1, *REPLAY, "--out", out, extra=["-x", "DFL_TEST_MPI_EXIT"],
                           env={**ENV, "DFL_TEST_MPI_EXIT": "1:4"})
    t.check(p.returncode != 0, f"mpirun exit status {p.returncode}")
    with open(os.path.join(out, "results.jsonl")) as f:
        n = sum(1 for x in f if x.endswith("\n"))
    t.check(n >= 4, f"the lines received are kept: {n}")
    p = mpirun(2, *REPLAY, "--out", out, "--resume")
    t.check(p.returncode == 0, f"--resume: {p.stderr[-600:]}")
    same(one, out, "job ended by mpirun, then --resume")


def refusals():
    p = mpirun(2, *REPLAY, "--out", one)
    t.check(p.returncode != 0 and "--resume" in p.stderr, f"existing results without --resume: {p.stderr[-300:]}")
    p = mpirun(2, *REPLAY, "--out", os.path.join(tmp, "sf"), "--save-features", os.path.join(tmp, "sfd"))
    t.check(p.returncode != 0 and "--save-features" in p.stderr and "eval-merge" in p.stderr,
            f"--save-features refused: {p.stderr[-300:]}")
    # a rank that reads other prompts (the same count, other ids) is caught, not merged
    other = os.path.join(tmp, "other.jsonl")
    with open(GSM40) as f, open(other, "w") as g:
        for i, x in zip(range(7), f):
            g.write(json.dumps({**json.loads(x), "id": f"other-{i}"}) + "\n")
    mm = os.path.join(tmp, "mm")
    args1 = [a if a != GSM40 else other for a in REPLAY]
    p = subprocess.run([MPIRUN, "--oversubscribe", "-n", "1", DFL, "eval", *REPLAY, "--out", mm, ":", "-n", "1", DFL,
                        "eval", *args1, "--out", mm], capture_output=True, text=True, env=ENV, timeout=300)
    t.check(p.returncode != 0 and "every rank must read the same prompts" in p.stderr,
            f"another prompt set on rank 1 is refused: rc {p.returncode} {p.stderr[-400:]}")
    # rank 0 ran the rest, wrote the reports and names the unit rank 1 refused
    s = json.load(open(os.path.join(mm, "summary.json")))
    t.check("missing" in s.get("incomplete", "") and "rank 1:" in s["incomplete"] and s["prompts"] == 6,
            f"rank 0 finished the other prompts and names rank 1's failure: {s.get('incomplete')} {s['prompts']}")


t.run(version)
t.run(replay_identical)
t.run(online_mtbench)
t.run(features)
t.run(killed_recovery)
t.run(killed_default)
t.run(refusals)
t.done()
