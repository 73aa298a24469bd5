"""The Python package (docs/python.md): `pip wheel .` builds it with the project's CMake through
scikit-build-core, it installs into a fresh venv, and there dflash_eval's eval, replay, hidden,
generate and inspect equal the CLI's outputs (summary.json without timings, token for token,
bit for bit); bad arguments raise dflash_eval.Error; two threads calling at once both finish
with the sequential results; docs/python.md's training loop (tools/train/loop_example.py) runs on
the installed package. Skipped (exit 77) when the wheel cannot be built here (no
scikit-build-core reachable: an offline machine without the package index)."""
import json
import os
import subprocess
import sys
import tempfile

from dfltest import DATA, SOURCE, Tally, dfl, st_read_raw

t = Tally("python_api")
tmp = tempfile.mkdtemp(prefix="dfl-pyapi-")
TARGET, DRAFTER = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
PROMPTS = os.path.join(DATA, "gsm8k_test_40.jsonl")


def build_wheel():
    """The wheel's path, or None (and why) when it cannot be built here."""
    wheels = os.path.join(tmp, "wheels")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL="2")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", SOURCE, "-w", wheels, "--no-deps", "-q"],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return None, p.stderr[-2000:]
    return os.path.join(wheels, next(f for f in os.listdir(wheels) if f.endswith(".whl"))), ""


def fresh_venv(wheel):
    """A new venv with the wheel installed; numpy from this interpreter's site-packages (a .pth)."""
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import numpy  # the interpreter running the tests has it (the venv of the reference tests)
    with open(os.path.join(site, "host_numpy.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(numpy.__file__)) + "\n")
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "-q", wheel], check=True)
    return venv


# summary.json members that are measurements of time or memory, or checks of them: they differ between runs
TIMING = {"tokens_per_s", "speedup", "speedup_modeled", "draft_share", "verify_share", "rollback_share",
          "speedup_spread", "speedup_modeled_spread", "speedup_runs", "decode_s", "prefill_s", "peak_rss_bytes",
          "costs", "features_dir", "speedup_modeled_reliable", "speedup_modeled_warning"}


def comparable(s):
    if isinstance(s, dict):
        return {k: comparable(v) for k, v in s.items() if k not in TIMING}
    if isinstance(s, list):
        return [comparable(v) for v in s]
    return s


def main():
    wheel, why = build_wheel()
    if not wheel:
        print(f"SKIP: the wheel cannot be built here (pip wheel . failed; offline without scikit-build-core?):\n{why}")
        sys.exit(77)
    venv = fresh_venv(wheel)
    py = os.path.join(venv, "bin", "python")
    v = subprocess.run([os.path.join(venv, "bin", "dfl"), "--version"], capture_output=True, text=True)
    t.check(v.returncode == 0 and v.stdout.startswith("dfl "), f"the dfl console script runs: {v.stdout}{v.stderr}")

    # the CLI's results, then the API's in the fresh venv (tests/py/python_api_inside.py)
    cli_eval, feat = os.path.join(tmp, "cli-eval"), os.path.join(tmp, "features")
    dfl("eval", "--target", TARGET, "--drafter", DRAFTER, "--prompts", PROMPTS, "--limit", 3, "--max-new", 32,
        "--tree-budget", "0,4", "--out", cli_eval, "--save-features", feat, "--progress", "none")
    cli_replay = os.path.join(tmp, "cli-replay")
    dfl("eval", "--features", feat, "--drafter", DRAFTER, "--tree-budget", "0,4,8", "--out", cli_replay,
        "--progress", "none")
    hid = os.path.join(tmp, "hidden.safetensors")
    dfl("hidden", "--target", TARGET, "--layers", "1,5", "--prompt-ids", "1,2,3,4,5", "--out", hid)
    gen = json.loads(dfl("generate", "--target", TARGET, "--drafter", DRAFTER, "--prompt", "The sum of 2 and 3 is",
                         "--max-new", 24, "--json").stdout)
    inspect_cli = json.loads(dfl("inspect", DRAFTER, "--target", TARGET, "--json").stdout)

    args = dict(tmp=tmp, target=TARGET, drafter=DRAFTER, prompts=PROMPTS, features=feat)
    p = subprocess.run([py, os.path.join(SOURCE, "tests", "py", "python_api_inside.py"), json.dumps(args)],
                       capture_output=True, text=True, cwd=tmp, env=dict(os.environ, PYTHONPATH=""))
    if not t.check(p.returncode == 0, f"the API run in the fresh venv: rc {p.returncode}\n{p.stderr[-3000:]}"):
        return
    r = json.loads(p.stdout.strip().splitlines()[-1])
    t.check(r["module"].startswith(venv), f"dflash_eval imported from the fresh venv: {r['module']}")

    def summary(d):
        return json.load(open(os.path.join(d, "summary.json")))
    ce, cr = comparable(summary(cli_eval)), comparable(summary(cli_replay))
    for k in ("eval", "replay", "replay_a", "replay_b"):
        r[k] = comparable(r[k])
    t.check(r["eval"] == ce, f"dfl.eval equals dfl eval's summary.json:\n{r['eval']}\n{ce}")
    t.check(r["replay"] == cr, f"dfl.replay equals dfl eval --features':\n{r['replay']}\n{cr}")
    t.check(r["replay_a"] == cr and r["replay_b"] == cr, "two threads replaying at once: both equal the sequential run")
    t.check(r["progress"] == [[1, 3], [2, 3], [3, 3]], f"progress callback: {r['progress']}")
    _, hdr, data = st_read_raw(hid)
    for layer in ("1", "5"):
        meta = hdr[f"layer.{layer}"]
        a, b = meta["data_offsets"]
        t.check(r["hidden_bytes"][layer] == data[a:b].hex(), f"dfl.hidden layer {layer} equals dfl hidden bit for bit")
    t.check(r["generate"]["tokens"] == gen["tokens"] and r["generate"]["stats"]["tau"] == gen["stats"]["tau"] and
            r["generate"]["stats"]["acceptance_lengths"] == gen["stats"]["acceptance_lengths"],
            f"dfl.generate equals dfl generate --json: {r['generate']['stats']} vs {gen['stats']}")
    t.check(r["inspect"] == inspect_cli, "dfl.inspect equals dfl inspect --json")
    for what, msg in r["errors"].items():
        t.check(msg.startswith("Error: ") and "Traceback" not in msg, f"{what} raises dflash_eval.Error: {msg}")
    t.check("expected an integer in [1, 1073741824], found \"three\"" in r["errors"]["limit"], r["errors"]["limit"])
    t.check("unknown option \"max_tokens\"" in r["errors"]["unknown"], r["errors"]["unknown"])
    t.check("layers[0]: expected a decoder layer in [0, " in r["errors"]["layer"], r["errors"]["layer"])
    t.check(r["callback_error"] == "ValueError: stop", f"a progress callback's exception is raised: {r['callback_error']}")

    # docs/python.md's training loop (tools/train/loop_example.py), a few steps, on the installed package:
    # each checkpoint scored by dfl next to its training accuracy
    p = subprocess.run([py, os.path.join(SOURCE, "tools", "train", "loop_example.py"), "--steps", "4", "--every", "2",
                        "--train", "4", "--eval", "2", "--max-new", "32", "--work", os.path.join(tmp, "loop")],
                       capture_output=True, text=True, cwd=tmp, env=dict(os.environ, PYTHONPATH=""))
    steps = [x for x in p.stdout.splitlines() if x.startswith("step ")]
    t.check(p.returncode == 0 and len(steps) == 2 and all("dfl on held-out: tau" in x for x in steps),
            f"the training-loop example runs and logs dfl's tau per checkpoint: rc {p.returncode}\n{p.stdout[-1500:]}"
            f"{p.stderr[-1500:]}")


main()
t.done()
