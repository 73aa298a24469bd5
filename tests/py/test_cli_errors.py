"""Bad input gives a clear message and a non-zero exit, never a crash: malformed checkpoints
(truncated, overlapping or holed offsets, header beyond the file, wrong shape, missing tensor,
unsupported dtype, NaN weights, bad JSON, missing shard), bad options, contexts that do not fit,
drafters that do not fit their target, --device naming a device the build lacks or the machine
cannot run. Arguments: names of the sub-tests to run (default all), e.g. `devices`."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

from dfltest import DFL, SOURCE, Tally, dfl, fixture, run, st_read_raw, st_write_raw

t = Tally("cli errors")
tmp = tempfile.mkdtemp(prefix="dfl-bad-")


def copy_fixture(name, new):
    d = os.path.join(tmp, new)
    shutil.copytree(fixture(name), d)
    return d


def expect_fail(args, *needles, code=None):
    p = dfl(*args, check=False)
    ok = p.returncode not in (0,) and p.returncode > 0 and (code is None or p.returncode == code)
    msg = p.stderr
    t.check(ok, f"{args}: expected a clean failure, got rc {p.returncode}: {msg[-500:]}")
    for n in needles:
        t.check(n in msg, f"{args}: message lacks {n!r}: {msg[-500:]}")


def raw_header(path):
    return st_read_raw(path)[1:]


def malformed_checkpoints():
    st = "model.safetensors"
    d = copy_fixture("qwen3_tiny", "truncated")
    p = os.path.join(d, st)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 100)
    expect_fail(["inspect", d], "model.safetensors", "beyond the data buffer")

    d = copy_fixture("qwen3_tiny", "overlap")
    hdr, data = raw_header(os.path.join(d, st))
    names = sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])
    b0, e0 = hdr[names[1]]["data_offsets"]
    hdr[names[1]]["data_offsets"] = [b0 - 4, e0 - 4]  # overlaps the previous tensor
    st_write_raw(os.path.join(d, st), hdr, data)
    expect_fail(["inspect", d], "overlaps the previous tensor")

    d = copy_fixture("qwen3_tiny", "hole")
    hdr, data = raw_header(os.path.join(d, st))
    last = names[-1]
    b, e = hdr[last]["data_offsets"]
    hdr[last]["data_offsets"] = [b + 4, e + 4]
    st_write_raw(os.path.join(d, st), hdr, data + b"\0" * 4)
    expect_fail(["inspect", d], "hole before it")

    d = copy_fixture("qwen3_tiny", "hdrsize")
    hdr, data = raw_header(os.path.join(d, st))
    st_write_raw(os.path.join(d, st), hdr, data, hlen=10**8 - 1)
    expect_fail(["inspect", d], "beyond the end of the file")

    d = copy_fixture("qwen3_tiny", "badheader")
    with open(os.path.join(d, st), "wb") as f:
        f.write(struct.pack("<Q", 10) + b'{"a": [1,]' + b"\0" * 8)
    expect_fail(["inspect", d], "not valid JSON")

    w = load_file(os.path.join(fixture("qwen3_tiny"), st))
    d = copy_fixture("qwen3_tiny", "shape")
    x = dict(w)
    name = "model.layers.1.mlp.up_proj.weight"
    x[name] = np.ascontiguousarray(x[name].T)
    save_file(x, os.path.join(d, st))
    expect_fail(["inspect", d], name, "has shape [64, 128], expected [128, 64]")

    d = copy_fixture("qwen3_tiny", "missing")
    x = dict(w)
    del x["model.layers.2.self_attn.k_norm.weight"]
    save_file(x, os.path.join(d, st))
    expect_fail(["inspect", d], "missing tensor 'model.layers.2.self_attn.k_norm.weight' (expected shape [32])")

    d = copy_fixture("qwen3_tiny", "dtype")
    x = dict(w)
    x["model.layers.0.mlp.down_proj.weight"] = x["model.layers.0.mlp.down_proj.weight"].astype(np.int8)
    save_file(x, os.path.join(d, st))
    expect_fail(["inspect", d], "model.layers.0.mlp.down_proj.weight", "dtype I8", "F32, F16, BF16")

    d = copy_fixture("qwen3_tiny", "nan")
    x = dict(w)
    x["model.layers.3.mlp.gate_proj.weight"] = x["model.layers.3.mlp.gate_proj.weight"].copy()
    x["model.layers.3.mlp.gate_proj.weight"][5, 7] = np.nan
    save_file(x, os.path.join(d, st))
    expect_fail(["generate", "--target", d, "--prompt-ids", "1,2,3", "--max-new", "2", "--check-weights"],
                "model.layers.3.mlp.gate_proj.weight", "non-finite")
    # without --check-weights the weights are not scanned; the NaN logits stop the run
    expect_fail(["generate", "--target", d, "--prompt-ids", "1,2,3", "--max-new", "2"],
                "target logits are not finite", "dfl inspect --check-weights")

    d = copy_fixture("qwen3_tiny", "badconfig")
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model_type": "qwen3", "hidden_size": 64,,}')
    expect_fail(["inspect", d], "config.json", "not valid JSON")

    d = copy_fixture("qwen3_tiny", "arch")
    cfg = json.load(open(os.path.join(fixture("qwen3_tiny"), "config.json")))
    cfg["model_type"] = "mistral"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    expect_fail(["inspect", d], "unsupported model_type 'mistral'", "qwen3_5_text")

    d = copy_fixture("qwen35_sharded", "shard")
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    victim = sorted(set(idx["weight_map"].values()))[1]
    os.remove(os.path.join(d, victim))
    expect_fail(["inspect", d], victim, "missing")


def bad_options():
    tiny = fixture("qwen3_tiny")
    expect_fail(["generate", "--target", tiny, "--prompt-ids", ",".join(["5"] * 20), "--max-context", "10"],
                "exceeds --max-context 10")
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--max-new", "0"], "--max-new", code=2)
    expect_fail(["generate", "--target", fixture("qwen35_vlm"), "--prompt-ids", "1,2", "--max-context", "16000000"],
                "GiB", "lower --max-context")
    expect_fail(["generate", "--target", tiny], "exactly one of --prompt", code=2)
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,x"], "--prompt-ids")
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,5000"], "outside the vocabulary")
    expect_fail(["generate", "--target", tiny, "--prompt", "hi", "--chat", "vicuna"], "--chat", code=2)
    expect_fail(["generate", "--target", "/nonexistent"], "/nonexistent")
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1", "--frobnicate"], "unknown argument", code=2)
    expect_fail(["generate", "--target", tiny, "--drafter", fixture("dflash_qwen35"), "--prompt-ids", "1,2"],
                "does not fit", "hidden_size 128 != target hidden_size 64")
    expect_fail(["generate", "--target", tiny, "--drafter", fixture("dflash_qwen3"), "--prompt-ids", "1,2",
                 "--block-size", "0"], "--block-size", code=2)
    expect_fail(["generate", "--target", tiny, "--drafter", fixture("dflash_qwen3"), "--prompt-ids", "1,2",
                 "--block-size", "9"], "must be in [2, 8]")
    expect_fail(["generate", "--target", tiny, "--drafter", tiny, "--prompt-ids", "1,2"], "not a DFlash drafter")
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--temperature", "-1"], "--temperature", code=2)
    # sampling filters: top_p in (0, 1], top_k >= 0, and only with sampling
    for bad in ("0", "1.5", "-0.1", "nan", "x"):
        expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--temperature", "1", "--top-p", bad],
                    "--top-p", code=2)
    for bad in ("-1", "2.5", "x"):
        expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--temperature", "1", "--top-k", bad],
                    "--top-k", code=2)
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--top-p", "0.9"], "--temperature", code=2)
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--top-k", "20"], "--temperature", code=2)
    d3 = fixture("dflash_qwen3")
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--tree-budget", "4"], "needs --drafter", code=2)
    expect_fail(["generate", "--target", tiny, "--drafter", d3, "--prompt-ids", "1,2", "--tree-budget", "257"],
                "--tree-budget", code=2)
    expect_fail(["generate", "--target", tiny, "--drafter", d3, "--prompt-ids", "1,2", "--tree-budget", "-1"],
                "--tree-budget", code=2)
    expect_fail(["generate", "--target", tiny, "--drafter", d3, "--prompt-ids", "1,2", "--tree-budget", "4",
                 "--temperature", "1"], "greedy", code=2)
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,2", "--dump-drafts", "/tmp/x"], "needs --drafter",
                code=2)
    expect_fail(["serve", "--target", tiny, "--tree-budget", "4"], "needs --drafter", code=2)
    expect_fail(["serve", "--target", tiny, "--drafter", d3, "--tree-budget", "999"], "--tree-budget", code=2)
    expect_fail(["hidden", "--target", tiny, "--layers", "0,9", "--prompt-ids", "1,2", "--out", "/tmp/x.st"],
                "layer 9 does not exist")
    expect_fail(["hidden-diff", "/nonexistent.st", "/nonexistent2.st"], "/nonexistent.st")
    p = dfl("inspect", fixture("dflash_qwen35"), "--target", tiny, check=False)
    t.check(p.returncode == 1 and "NOT compatible" in p.stdout and "target_layer_ids" in p.stdout,
            f"incompatible drafter: {p.stdout}")
    expect_fail(["inspect"], "missing checkpoint directory", code=2)
    for cmd in ("inspect", "generate", "hidden", "hidden-diff", "tokenize"):
        p = dfl(cmd, "--help", check=False)
        t.check(p.returncode == 0 and "usage:" in p.stdout, f"{cmd} --help")
    p = dfl(check=False)
    t.check(p.returncode == 2 and "usage" in p.stderr, "dfl without a command")
    expect_fail(["frobnicate"], "unknown command", code=2)


def num_target_layers():
    """A drafter whose num_target_layers differs from the target's layer count is a warning naming
    both values in generate, eval, inspect and serve (z-lab's package does not check it); layer ids past
    the target's layers are an error."""
    d = copy_fixture("dflash_qwen3", "ntl6")
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["num_target_layers"] = 6  # qwen3_tiny has 4 layers; the ids [0, 2] fit it
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    want = "num_target_layers 6 differs from the target's 4 layers"
    tiny = fixture("qwen3_tiny")
    p = dfl("generate", "--target", tiny, "--drafter", d, "--prompt-ids", "1,2,3", "--max-new", "4", check=False)
    t.check(p.returncode == 0 and want in p.stderr, f"generate: a warning, not a refusal: rc {p.returncode} {p.stderr}")
    prompts = os.path.join(tmp, "p.jsonl")
    with open(prompts, "w") as f:
        f.write(json.dumps({"question": "What is 2 + 3?"}) + "\n")
    p = dfl("eval", "--target", tiny, "--drafter", d, "--prompts", prompts, "--max-new", "8", "--out",
            os.path.join(tmp, "ntl-eval"), "--progress", "none", check=False)
    t.check(p.returncode == 0 and want in p.stderr, f"eval: a warning: rc {p.returncode} {p.stderr[-400:]}")
    p = dfl("inspect", d, "--target", tiny, check=False)
    t.check(want in p.stdout + p.stderr, f"inspect --target: the warning: {p.stdout[-400:]}")
    # serve: the warning before the listening line (read until it; bounded by the process's end)
    srv = subprocess.Popen([DFL, "serve", "--target", tiny, "--drafter", d, "--port", "0"], stderr=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, text=True)
    lines = []
    for line in srv.stderr:
        lines.append(line)
        if "listening on" in line:
            break
    srv.send_signal(signal.SIGTERM)
    srv.communicate(timeout=120)
    t.check(any(want in x for x in lines) and "listening on" in lines[-1], f"serve: the warning: {lines}")
    cfg["dflash_config"]["target_layer_ids"] = [0, 5]
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    expect_fail(["generate", "--target", tiny, "--drafter", d, "--prompt-ids", "1,2,3", "--max-new", "4"],
                "target_layer_ids", "5")
    # bench --parts names every part, tree included
    expect_fail(["bench", "--model", tiny, "--parts", "decode,bogus"], "--parts 'decode,bogus'", "rollback, tree, peak",
                code=2)


def duplicate_prompt_ids():
    """Results are keyed by prompt id: a repeated id is refused naming both lines, also in a large file."""
    p = os.path.join(tmp, "dup.jsonl")
    with open(p, "w") as f:
        for i in range(20000):
            f.write(json.dumps({"id": f"q{i}", "question": "x"}) + "\n")
        f.write(json.dumps({"id": "q7", "question": "y"}) + "\n")
    expect_fail(["eval", "--target", fixture("qwen3_tiny"), "--drafter", fixture("dflash_qwen3"), "--prompts", p,
                 "--out", os.path.join(tmp, "dup-out")], "dup.jsonl:20001", "prompt id 'q7' repeats line 8's")


def messages():
    """Issue 22 item 5: every numeric option range-checked before any cast, the message naming the
    option and the value as given; prompt files in another shape get the line and a hint; a port
    in use is named; help texts; dfl --version."""
    tiny, d3 = fixture("qwen3_tiny"), fixture("dflash_qwen3")
    prompts = os.path.join(tmp, "msg.jsonl")
    with open(prompts, "w") as f:
        f.write(json.dumps({"question": "What is 2 + 3?"}) + "\n")
    ev = ["eval", "--target", tiny, "--drafter", d3, "--prompts", prompts, "--out", os.path.join(tmp, "msg-eval")]
    gen = ["generate", "--target", tiny, "--drafter", d3, "--prompt-ids", "1,2"]
    srv = ["serve", "--target", tiny, "--drafter", d3]
    for big in ("100000", "99999999999999999999", "4294967297"):
        for cmd in (ev, gen, srv):
            expect_fail(cmd + ["--tree-budget", big], "--tree-budget", f"{big} is out of range", code=2)
    expect_fail(ev + ["--tree-budget", "8,100000"], "--tree-budget: 100000 is out of range [0, 4096]", code=2)
    expect_fail(ev + ["--tree-budget", "8,x"], "--tree-budget", "found 'x' in '8,x'", code=2)
    expect_fail(ev + ["--tree-budget", "8,,16"], "--tree-budget", "empty item", code=2)
    expect_fail(ev + ["--tree-budget", ",".join(["1"] * 17)], "--tree-budget", "at most 16", code=2)
    expect_fail(ev + ["--tree-budget", "300", "--online"], "--tree-budget 300", "[0, 256] online", code=2)
    expect_fail(ev + ["--save-features", os.path.join(tmp, "f"), "--save-layers", "1,99999999999"],
                "--save-layers: 99999999999 is out of range", code=2)
    expect_fail(ev + ["--shard", "4294967296/2"], "--shard", "'4294967296/2'", code=2)
    expect_fail(ev + ["--max-new", "99999999999999999999"], "--max-new: 99999999999999999999 is out of range",
                code=2)
    expect_fail(gen + ["--max-new", "1e3"], "--max-new: expected an integer, found '1e3'", code=2)
    expect_fail(srv + ["--port", "65536"], "--port: 65536 is out of range [0, 65535]", code=2)
    expect_fail(srv + ["--timeout", "-1"], "--timeout", "-1", code=2)
    expect_fail(srv + ["--max-connections", "0"], "--max-connections", "0", code=2)
    expect_fail(srv + ["--max-connections", "8", "--max-connections-per-client", "9"],
                "--max-connections-per-client 9 exceeds --max-connections 8", code=2)
    expect_fail(ev + ["--record-mode", "sometimes"], "--record-mode", "auto", "'sometimes'", code=2)
    expect_fail(ev + ["--protocol", "foo"], "--protocol: expected zlab, found 'foo'", code=2)
    expect_fail(ev + ["--protocol", "zlab", "--dump-prompts", os.path.join(tmp, "no", "such", "dir", "p.jsonl")],
                "p.jsonl: cannot create")
    expect_fail(ev + ["--tokenizer", os.path.join(tmp, "no-such-tokenizer.json")], "no-such-tokenizer.json")
    expect_fail(["generate", "--target", tiny, "--prompt-ids", "1,99999999999"],
                "--prompt-ids: token id 99999999999 is out of range")
    expect_fail(["hidden", "--target", tiny, "--layers", "1, 99999999999", "--prompt-ids", "1", "--out",
                 os.path.join(tmp, "h.st")], "--layers: 99999999999 is out of range [0, 255]", code=2)
    expect_fail(["hidden", "--target", tiny, "--layers", "0,,1", "--prompt-ids", "1", "--out",
                 os.path.join(tmp, "h.st")], "--layers", "empty item", code=2)

    # prompt files in another shape: the line and the --format that fits
    def prompt_file(name, text, *needles, fmt=None):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        args = ["eval", "--target", tiny, "--drafter", d3, "--prompts", path, "--out", os.path.join(tmp, "pf-out"),
                "--progress", "none"] + (["--format", fmt] if fmt else [])
        expect_fail(args, *needles, code=1)

    prompt_file("p.csv", 'question,answer\n"What is 2+2?",4\n', "p.csv:1:", "not a JSON object", "--format text")
    prompt_file("arr.json", json.dumps([{"question": "a"}, {"question": "b"}]) + "\n", "arr.json:1:",
                "a JSON array", "JSON lines", "--format text")
    prompt_file("arr2.json", '[\n  {"question": "a"}\n]\n', "arr2.json:1:", "a JSON array")
    prompt_file("pretty.json", '{"question":\n "a"}\n', "pretty.json:1:", "one object per line")
    prompt_file("prompt.jsonl", '{"prompt": "a"}\n', "prompt.jsonl:1:", "missing string field 'question'",
                "use --format jsonl:prompt")
    prompt_file("late.jsonl", '{"question": "a"}\n\n{"prompt": "b"}\n', "late.jsonl:3:", "--format jsonl:prompt")
    prompt_file("turns.jsonl", '{"turns": ["a"]}\n', "turns.jsonl:1:", "use --format mtbench", fmt="jsonl:prompt")
    prompt_file("other.jsonl", '{"q": "a", "n": 1}\n', "other.jsonl:1:", 'its string fields: "q"',
                "--format jsonl:FIELD")

    # a port in use: the host:port and the reason, not libmicrohttpd's "Failed to bind to port 0"
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    p = dfl("serve", "--target", tiny, "--port", port, check=False, timeout=60)
    s.close()
    t.check(p.returncode == 1 and f"cannot listen on 127.0.0.1:{port}: the port is in use" in p.stderr
            and "Failed to bind" not in p.stderr, f"port in use: rc {p.returncode} {p.stderr}")

    # help: no printf escapes left in any help text; generate's usage lists --tree-budget
    for cmd in ("inspect", "tokenize", "generate", "hidden", "hidden-diff", "eval", "eval-merge", "eval-compare", "bench",
                "serve"):
        p = dfl(cmd, "--help", check=False)
        t.check(p.returncode == 0 and "usage:" in p.stdout and "%%" not in p.stdout, f"{cmd} --help: {p.stdout[:200]}")
    usage = dfl("generate", "--help").stdout.split("\n\n")[0]
    t.check("--tree-budget" in usage and "--ignore-eos" in usage, f"generate usage line: {usage}")
    for args in (["--version"], ["version"]):
        p = dfl(*args, check=False)
        lines = dict(ln.split(" ", 1) for ln in p.stdout.strip().splitlines())
        t.check(p.returncode == 0 and set(lines) == {"dfl", "commit", "build", "isa", "act", "threads", "mpi", "devices"},
                f"dfl {args}: {p.stdout}")
        t.check(lines.get("devices", "").split(" (")[0] in ("cpu", "cpu cuda"), f"dfl {args}: devices {p.stdout}")
        t.check(lines.get("mpi") == "no" or lines.get("mpi", "").startswith(("Open MPI", "MPICH")),
                f"dfl {args}: mpi {p.stdout}")
        t.check(lines.get("isa", "").split()[0] in ("generic", "avx2", "avx512", "avx512bf16", "amx"),
                f"dfl {args}: isa {p.stdout}")
        t.check(len(lines.get("commit", "")) >= 4, f"dfl {args}: commit {p.stdout}")
    # libgomp's idle spinning: dfl sets GOMP_SPINCOUNT (and runs itself again) unless the user chose
    plain = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for extra, want in (({}, "OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=3000"),
                        ({"GOMP_SPINCOUNT": "77"}, "OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=77"),
                        ({"OMP_WAIT_POLICY": "passive"}, "OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=(unset)")):
        line = [x for x in dfl("--version", env={**plain, **extra}).stdout.splitlines() if x.startswith("threads ")]
        t.check(len(line) == 1 and line[0].endswith("idle threads: " + want), f"--version with {extra}: {line}")
    p = dfl("--version", env={**os.environ, "DFL_ISA": "generic"})
    t.check("isa generic" in p.stdout, f"DFL_ISA=generic: {p.stdout}")
    t.check("act f32" in p.stdout, f"activations f32 by default: {p.stdout}")
    p = dfl("--version", env={**os.environ, "DFL_ACT": "fp4"})
    t.check("act f32" in p.stdout and "DFL_ACT" in p.stderr and "fp4" in p.stderr, f"DFL_ACT=fp4 named: {p.stderr}")
    p = dfl("bench", "--act", "fp4", check=False)
    t.check(p.returncode == 2 and "--act" in p.stderr and "fp4" in p.stderr, f"bench --act fp4: {p.stderr}")
    t.check("version" in dfl("--help").stdout, "dfl --help lists version")


def devices_built(binary):
    """The devices a dfl binary has ("cpu", "cuda") and its `devices` line of --version."""
    line = [x for x in run([binary, "--version"]).stdout.splitlines() if x.startswith("devices ")][0]
    return line[len("devices "):].split(" (")[0].split(), line


def devices():
    """--device on generate, hidden, bench, eval and serve: an unknown name is a usage error (exit 2)
    naming the devices this build has; cuda on a build without the CUDA backend the same, saying
    how to build it; on a CUDA build where no GPU answers (CI: build-cuda/dfl, or DFL_CUDA_BIN) a
    clean failure (exit 1) saying "no usable GPU", before any output is written."""
    tiny, d3 = fixture("qwen3_tiny"), fixture("dflash_qwen3")
    prompts = os.path.join(tmp, "dev.jsonl")
    with open(prompts, "w") as f:
        f.write(json.dumps({"question": "What is 2 + 3?"}) + "\n")

    def commands(tag):
        return {"generate": ["generate", "--target", tiny, "--prompt-ids", "1,2,3", "--max-new", "2"],
                "hidden": ["hidden", "--target", tiny, "--layers", "0", "--prompt-ids", "1,2", "--out",
                           os.path.join(tmp, f"dev-{tag}.safetensors")],
                "bench": ["bench", "--model", tiny, "--parts", "decode", "--decode", "2", "--context", "8"],
                "eval": ["eval", "--target", tiny, "--drafter", d3, "--prompts", prompts, "--max-new", "4", "--out",
                         os.path.join(tmp, f"dev-{tag}-eval"), "--progress", "none"],
                "serve": ["serve", "--target", tiny, "--port", "0"]}

    built, _ = devices_built(DFL)
    t.check(built[0] == "cpu", f"devices built: {built}")
    for name, args in commands("bogus").items():
        expect_fail(args + ["--device", "bogus"], "--device 'bogus': unknown device",
                    f"devices built: {' '.join(built)}", code=2)
        expect_fail(args + ["--device"], "--device", code=2)
    if "cuda" not in built:
        for name, args in commands("nocuda").items():
            expect_fail(args + ["--device", "cuda"], "--device cuda: this build has no cuda backend",
                        "devices built: cpu", "-DDFL_CUDA=ON", code=2)
        t.check(not os.path.exists(os.path.join(tmp, "dev-nocuda-eval")), "eval --device cuda: no --out written")

    # a CUDA build where no GPU answers: this binary, $DFL_CUDA_BIN, or build-cuda/dfl when it is not
    # older than this binary (an older one may predate the sources under test: scripts/test.sh
    # builds it after build/ and checks it with DFL_BIN=build-cuda/dfl)
    cuda = DFL if "cuda" in built else os.environ.get("DFL_CUDA_BIN", "")
    if not cuda:
        cuda = os.path.join(SOURCE, "build-cuda", "dfl")
        if os.access(cuda, os.X_OK) and os.path.getmtime(cuda) < os.path.getmtime(DFL):
            print(f"devices: {cuda} is older than {DFL}: --device cuda without a GPU not checked", flush=True)
            return
    if not os.access(cuda, os.X_OK):
        print(f"devices: no CUDA build ({cuda}): --device cuda without a GPU not checked", flush=True)
        return
    cbuilt, line = devices_built(cuda)
    if "cuda" not in cbuilt:
        t.check(False, f"{cuda}: built without the CUDA backend: {line}")
        return
    if "no usable GPU" not in line:
        print(f"devices: {cuda} has a usable GPU ({line}): tests/gpu check --device cuda", flush=True)
        return
    for name, args in commands("nogpu").items():
        p = run([cuda] + args + ["--device", "cuda"], check=False, timeout=120)
        t.check(p.returncode == 1 and f"dfl {name}: " in p.stderr and "no usable GPU" in p.stderr,
                f"{cuda} {name} --device cuda without a GPU: rc {p.returncode}: {p.stderr[-400:]}")
        p = run([cuda] + args + ["--device", "bogus"], check=False, timeout=120)
        t.check(p.returncode == 2 and "devices built: cpu cuda" in p.stderr,
                f"{cuda} {name} --device bogus: rc {p.returncode}: {p.stderr[-400:]}")
    t.check(not os.path.exists(os.path.join(tmp, "dev-nogpu-eval")), "eval --device cuda without a GPU: no --out")
    p = run([cuda] + commands("cpu")["generate"] + ["--device", "cpu"], check=False, timeout=120)
    t.check(p.returncode == 0, f"{cuda} generate --device cpu: rc {p.returncode}: {p.stderr[-400:]}")


subtests = [malformed_checkpoints, messages, bad_options, duplicate_prompt_ids, num_target_layers, devices]
only = sys.argv[1:]
for fn in subtests:
    if not only or fn.__name__ in only:
        t.run(fn)
t.done()
