"""dfl bench and bench/run work end to end on small fixtures (structure of the results, option
errors); no timing is checked: the figures depend on the machine."""
import importlib.machinery
import importlib.util
import json
import os
import struct
import tempfile

from dfltest import DFL, PY, SOURCE, Tally, dfl, fixture, run

SIZES = ["--context", "16", "--decode", "2", "--prefill", "70", "--reps", "1", "--probe-mb", "64"]
SMALL = SIZES + ["--verify-max", "5", "--gen", "4"]


def bench_json(*args):
    return json.loads(dfl("bench", "--json", *args, *SMALL).stdout)


def check_full(t):
    r = bench_json("--model", fixture("qwen35_vlm"), "--drafter", fixture("dflash_qwen35"), "--threads", "2")
    for key in ("isa", "act", "threads", "probe_gbps", "decode_gbps", "decode_tokens_per_s", "draft_block_ms",
                "ar_tokens_per_s", "spec_tokens_per_s", "spec_tau", "prefill_tokens_per_s"):
        t.check(key in r, f"bench --json has {key}")
    t.check(r["threads"] == 2 and r["act"] == "f32", f"threads {r['threads']}, act {r['act']}")
    t.check(0 < r["decode_vs_probe_paired"] < 100, f"paired decode share {r.get('decode_vs_probe_paired')}")
    t.check(r["peak_macs_per_s"] > 1e8 and r["peak_instruction"] and r["token_macs"] > 0 and
            len(r["verify_peak_share"]) == len(r["verify_ms"]) and all(0 < x < 1.5 for x in r["verify_peak_share"]),
            f"peak part: {r.get('peak_macs_per_s')} {r.get('peak_instruction')} {r.get('verify_peak_share')}")
    # on AMX also the rate with the tiles loaded as products of many tokens load them; elsewhere not measured
    amx = r["isa"] == "amx"
    t.check((r.get("peak_loaded_macs_per_s", 0) > 1e8 and "B tiles from L2" in r["peak_loaded_instruction"]) if amx
            else "peak_loaded_macs_per_s" not in r, f"loaded peak on {r['isa']}: {r.get('peak_loaded_macs_per_s')}")
    p = dfl("bench", "--parts", "peak,verify,tree", "--model", fixture("qwen35_vlm"), *SMALL)
    t.check("roofline   verify(" in p.stdout and "share of the peak" in p.stdout, f"roofline line: {p.stdout}")
    t.check("roofline   tree-64 (65 nodes)" in p.stdout and (" ms loaded" in p.stdout) == amx,
            f"tree roofline, loaded rate where amx: {p.stdout}")
    p = dfl("bench", "--json", "--isa", "avx512", "--parts", "peak", "--model", fixture("qwen35_vlm"), *SMALL,
            check=False)
    if p.returncode == 0:  # not measured off AMX
        t.check("peak_loaded_macs_per_s" not in json.loads(p.stdout), f"avx512 peak: {p.stdout}")
    t.check(len(r["verify_cost"]) == 5 and r["verify_cost"][0] == 1.0, f"verify_cost {r['verify_cost']}")
    t.check(all(v > 0 for v in r["verify_ms"]) and r["verify_logits_ms"] > 0, "verify times are positive")
    check_estimate(t, r)


def check_estimate(t, r):
    """Where greedy verification estimates a BF16 lm_head (float32 activations on AMX, or AVX-512 BF16
    under the avx512 and avx512bf16 paths), the bench measures the estimate's rate and takes the
    lm_head at it in its floors; a float32 lm_head (qwen35_vlm) is never estimated."""
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    kind = r["isa"] == "amx" or (r["isa"] in ("avx512", "avx512bf16") and "avx512_bf16" in flags)
    t.check(("peak_estimate_macs_per_s" in r) == kind and r.get("peak_estimate_macs_per_s", 1e9) > 1e8,
            f"estimate rate on {r['isa']}: {r.get('peak_estimate_macs_per_s')} {r.get('peak_estimate_instruction')}")
    t.check(r["lm_head_estimated"] is False, "qwen35_vlm's float32 lm_head is not estimated")
    sizes = SIZES + ["--verify-max", "8"]  # from 6 tokens on
    b = dfl("bench", "--json", "--parts", "peak,verify", "--model", fixture("qwen3_bf16"), *sizes)
    rb = json.loads(b.stdout)
    t.check(rb["lm_head_estimated"] == kind, f"qwen3_bf16's BF16 lm_head estimated: {rb['lm_head_estimated']}")
    b = dfl("bench", "--parts", "peak,verify", "--model", fixture("qwen3_bf16"), *sizes)
    t.check(("(the lm_head's at the estimate's rate)" in b.stdout) == kind and "with every row's logits" in b.stdout,
            f"verify roofline with the estimate: {b.stdout}")
    rb = r["rollback"]
    t.check(rb["snapshot_mb"] > rb["replay_mb"] > 0, f"rollback memory {rb}")
    t.check(r["spec_tau"] >= 1.0, f"tau {r['spec_tau']}")
    t.check(r["drafter"]["kind"] == "dflash" and r["drafter"]["block"] == r["block"] == 16,
            f"drafter {r.get('drafter')}, block {r.get('block')}")


def check_drafter_kinds(t):
    """Every kind of drafter is benched through the loop's drafter interface, and the output says
    which: the target's MTP head ('mtp', default block 4 as in generate; 'DIR:mtp' on a target
    without its own head), a DFlash2 drafter; a target without an MTP head is refused, naming why."""
    parts = ["--parts", "draft,e2e"]
    for model, drafter, block, kind in ((fixture("qwen35_mtp"), "mtp", [], "mtp"),
                                        (fixture("qwen35_text"), fixture("qwen35_mtp") + ":mtp", ["--block", "3"], "mtp"),
                                        (fixture("qwen35_vlm"), fixture("dflash2_qwen35"), ["--block", "8"], "dflash2")):
        r = bench_json("--model", model, "--drafter", drafter, *parts, *block)
        d, b = r.get("drafter", {}), int(block[1]) if block else 4
        t.check(d.get("kind") == kind and d.get("path") == drafter and d.get("block") == r.get("block") == b and
                d.get("weight_bytes", 0) > 0, f"{drafter}: drafter {d}, block {r.get('block')}")
        t.check(r.get("draft_block_ms", 0) > 0 and r.get("draft_context_ms_per_token", 0) > 0,
                f"{drafter}: draft figures {r}")
        t.check(r.get("spec_tau", 0) >= 1.0 and r.get("spec_tokens_per_s", 0) > 0, f"{drafter}: e2e {r}")
    out = dfl("bench", "--model", fixture("qwen35_mtp"), "--drafter", "mtp", *parts, *SMALL).stdout
    t.check("drafter    mtp: mtp (block 4" in out and "draft      block of 4" in out, f"table: {out}")
    p = dfl("bench", "--model", fixture("qwen35_text"), "--drafter", "mtp", *parts, *SMALL, check=False)
    t.check(p.returncode == 1 and "has no MTP head: no mtp.* tensors" in p.stderr,
            f"no MTP head: {p.returncode} {p.stderr}")
    p = dfl("bench", "--model", fixture("qwen35_vlm"), "--drafter", fixture("dflash2_qwen35"), "--block", "17",
            *parts, *SMALL, check=False)
    t.check(p.returncode == 1 and "must be in [2, 16]" in p.stderr, f"block over block_size: {p.returncode} {p.stderr}")


def check_replay_part(t):
    """--parts probe,draft runs no target forward: the target opens for its embedding and lm_head
    alone (only they are copied), the context features are synthetic, and a DFlash drafter's
    --draft-batch blocks in one forward give a replay's drafting per output token against the
    decode floor. --weights map reads in place; a bad mode is named."""
    args = ["--model", fixture("qwen35_vlm"), "--drafter", fixture("dflash_qwen35"), "--parts", "probe,draft",
            "--weights", "copy"]
    r = bench_json(*args, "--draft-batch", "3")
    t.check(r.get("draft_batch") == 3 and r.get("draft_batch_ms", 0) > 0 and r.get("draft_block_ms", 0) > 0,
            f"batched draft: {r}")
    floor = r.get("decode_floor_ms", 0)
    t.check(floor > 0 and abs(floor - 1e3 * r["token_bytes"] / (r["probe_gbps"] * 1e9)) < 1e-3 * floor + 1e-3,
            f"decode floor {floor}, probe {r.get('probe_gbps')}, token bytes {r.get('token_bytes')}")
    t.check(r.get("replay_ms_per_token_per_drafter", 0) >= r["draft_batch_ms"] / 3, f"replay per token {r}")
    t.check(r.get("weights") == "copy" and 0 < r.get("weights_placed_bytes", 0) < r["weight_bytes"],
            f"head-only copy: {r.get('weights')} {r.get('weights_placed_bytes')} of {r['weight_bytes']}")
    out = dfl("bench", *args, *SMALL).stdout
    t.check("8 blocks in one forward" in out and "synthetic context features" in out and
            "x the target's decode floor" in out, f"table: {out}")
    r = bench_json(*args[:-2], "--weights", "map", "--draft-batch", "1")
    t.check(r.get("weights") == "map" and r.get("weights_placed_bytes") == 0 and "draft_batch_ms" not in r,
            f"--weights map, --draft-batch 1: {r}")
    r = bench_json("--model", fixture("qwen35_vlm"), "--drafter", "none", "--parts", "decode", "--weights", "copy")
    t.check(r.get("weights") == "copy" and r.get("weights_placed_bytes", 0) >= r["weight_bytes"] * 0.9,
            f"a full copy: {r.get('weights_placed_bytes')} of {r['weight_bytes']}")
    p = dfl("bench", "--weights", "mmap", check=False)
    t.check(p.returncode == 2 and "'mmap'" in p.stderr and "auto, map or copy" in p.stderr,
            f"bad --weights: {p.returncode} {p.stderr}")
    p = dfl("bench", "--draft-batch", "0", check=False)
    t.check(p.returncode == 2 and "--draft-batch" in p.stderr, f"bad --draft-batch: {p.returncode} {p.stderr}")
    p = run([DFL, "bench", "--json", "--model", fixture("qwen3_tiny"), "--drafter", "none", "--parts", "probe",
             "--probe-mb", "16"], env=dict(os.environ, DFL_WEIGHTS="fast"))
    t.check("DFL_WEIGHTS" in p.stderr and "'fast'" in p.stderr and "using auto" in p.stderr and
            json.loads(p.stdout).get("weights_why", "").startswith(("copy (auto", "map (auto")),
            f"a bad DFL_WEIGHTS is named and auto used: {p.stderr} {p.stdout[:300]}")


def check_big_model_holes(t):
    """tools/make_big_model.py --holes: the decoder layers are holes of a sparse file (read back as
    zeros, no disk), the rest is written; dfl bench --parts probe opens such a target for its
    embedding and lm_head alone (the only tensors it copies)."""
    out = tempfile.mkdtemp(prefix="dfl-holes-")
    run([PY, os.path.join(SOURCE, "tools", "make_big_model.py"), out, "--shape", "tiny", "--holes", "--threads", "1",
         "--pool-from", "4096"])
    path = os.path.join(out, "model.safetensors")
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n

        def data(name):
            b, e = header[name]["data_offsets"]
            f.seek(base + b)
            return f.read(e - b)
        layer = [k for k in header if k.startswith("model.layers.")]
        t.check(layer and all(not any(data(k)) for k in layer), f"{len(layer)} layer tensors read as zeros")
        t.check(any(data("model.embed_tokens.weight")) and any(data("lm_head.weight")), "embedding and lm_head written")
    st = os.stat(path)
    t.check(st.st_blocks * 512 < st.st_size, f"sparse: {st.st_blocks * 512} bytes on disk of {st.st_size}")
    r = bench_json("--model", out, "--drafter", "none", "--parts", "probe", "--weights", "copy")
    head = sum(2 * v["shape"][0] * v["shape"][1] for k, v in header.items()
               if k in ("model.embed_tokens.weight", "lm_head.weight"))
    t.check(r.get("weights") == "copy" and r.get("weights_placed_bytes") == head,
            f"head-only copy: {r.get('weights_placed_bytes')} bytes, head {head}")
    # its header is padded to 64 bytes: auto maps when every tensor of 64 KiB or more starts on a
    # cache line, and copies the file otherwise
    aligned = all((base + v["data_offsets"][0]) % 64 == 0 for k, v in header.items()
                  if k != "__metadata__" and v["data_offsets"][1] - v["data_offsets"][0] >= 65536)
    r = bench_json("--model", out, "--drafter", "none", "--parts", "probe")
    want = "map (auto: every tensor of 64 KiB or more starts on a cache line" if aligned else "copy (auto:"
    t.check(base % 64 == 0 and r.get("weights_why", "").startswith(want),
            f"auto on a file {'with' if aligned else 'without'} aligned matrices: {r.get('weights_why')}")


def check_tree(t):
    r = bench_json("--model", fixture("qwen35_vlm"), "--drafter", fixture("dflash_qwen35"), "--parts", "tree")
    tree = r.get("tree", [])
    t.check([x["budget"] for x in tree] == [1, 2, 4, 8, 16, 32, 64], f"tree budgets {tree}")
    t.check(all(x["tree_ms"] > 0 and x["chain_ms"] > 0 and 1 <= x["depth"] <= 15 for x in tree), f"tree rows {tree}")
    t.check(tree and tree[-1]["depth"] > 1, "the benchmark trees are deeper than one level")
    t.check(r["tree_logits_ms"] > 0, f"the largest tree with every node's logits: {r.get('tree_logits_ms')}")


def check_profile(t):
    """--parts profile: for a decode step, a verification of verify-max tokens, a 64-node tree and a
    drafter's block, each kind of kernel call's mean ms per forward; the kinds and the rest ('other') add up to the
    forward's time; the products and the lm_head take time on every forward, the delta rule and
    the convolution on a Qwen3.5 target, none on a Qwen3 one; the table says what the extra time
    over decode went to."""
    kinds = ("matmul", "lm_head", "attention", "recurrence", "conv", "elementwise", "logits")
    for name, hybrid in (("qwen35_vlm", True), ("qwen3_tiny", False)):
        r = bench_json("--model", fixture(name), "--drafter", "none", "--parts", "profile")
        p = r.get("profile", {})
        t.check(sorted(p) == ["decode", "tree", "verify"] and p["decode"]["tokens"] == 1 and
                p["verify"]["tokens"] == 5 and p["tree"]["tokens"] == 65, f"{name}: profile forwards {p}")
        for k, f in p.items():
            parts = sum(f[x + "_ms"] for x in kinds)
            t.check(all(f[x + "_ms"] >= 0 for x in kinds) and abs(parts + f["other_ms"] - f["total_ms"]) < 1e-3 and
                    parts <= f["total_ms"] * 1.001, f"{name} {k}: kinds {parts} + other {f['other_ms']} = total {f['total_ms']}")
            t.check(f["matmul_ms"] > 0 and f["lm_head_ms"] > 0 and f["matmul_gbps"] > 0 and f["elementwise_ms"] > 0,
                    f"{name} {k}: products, lm_head, elementwise timed: {f}")
            t.check((f["recurrence_ms"] > 0 and f["conv_ms"] > 0) == hybrid and
                    (hybrid or f["recurrence_ms"] == 0 and f["conv_ms"] == 0), f"{name} {k}: delta rule, conv: {f}")
    out = dfl("bench", "--model", fixture("qwen35_vlm"), "--drafter", "none", "--parts", "profile", *SMALL).stdout
    t.check("delta-rule recurrence" in out and "verify(5) over decode" in out and "tree(65) over decode" in out,
            f"profile table: {out}")
    # with a drafter: its block of B too (the drafter opened for the profile alone)
    r = bench_json("--model", fixture("qwen35_vlm"), "--drafter", fixture("dflash_qwen35"), "--parts", "profile",
                   "--block", "6")
    d = r.get("profile", {}).get("draft", {})
    t.check(d.get("tokens") == 6 and d.get("lm_head_ms", 0) > 0 and d.get("matmul_ms", 0) > 0 and
            d.get("recurrence_ms") == 0 and abs(sum(d[x + "_ms"] for x in kinds) + d["other_ms"] - d["total_ms"]) < 1e-3,
            f"profile of a DFlash block: {d}")


def check_products(t):
    """--parts products: per weight shape, the mean ms of one product of n = 1, 6, 16, 17, 33, 65 tokens
    over every matrix of the forward in its order; the shapes' matrices add up to the sweep's bytes (at
    most what a decoded token reads) and their products to at most the sweep's time; an MoE target's
    routed experts are left out and counted (3 per expert and sparse layer), its router timed."""
    sizes = {"BF16": 2, "F32": 4, "F16": 2, "F8_E4M3": 1}
    for name, experts in (("qwen35_vlm", 0), ("qwen3_tiny", 0), ("qwen35_moe_vlm", 3 * 8 * 4)):
        r = bench_json("--model", fixture(name), "--drafter", "none", "--parts", "products")
        p = r.get("products", {})
        shapes = p.get("shapes", [])
        t.check(p.get("tokens") == [1, 6, 16, 17, 33, 65] and len(p.get("sweep_ms", [])) == 6 and shapes,
                f"{name}: products {p}")
        t.check(all(len(s["ms"]) == 6 and all(x > 0 for x in s["ms"]) and s["count"] > 0 for s in shapes),
                f"{name}: each shape timed at each n: {shapes}")
        mats = sum(s["count"] * s["rows"] * s["cols"] * sizes[s["dtype"]] for s in shapes)
        t.check(mats == p["bytes"] and 0 < p["bytes"] <= r["token_bytes"],
                f"{name}: shapes' bytes {mats}, sweep {p['bytes']}, per token {r['token_bytes']}")
        for k in range(6):
            parts = sum(s["count"] * s["ms"][k] for s in shapes)
            t.check(parts <= p["sweep_ms"][k] + 1e-3 * sum(s["count"] for s in shapes),
                    f"{name} n={p['tokens'][k]}: products {parts} ms within the sweep's {p['sweep_ms'][k]}")
        t.check(p.get("experts_left_out") == experts, f"{name}: experts left out {p.get('experts_left_out')}")
        if experts:
            t.check(any(s["rows"] == 8 and s["count"] == 4 for s in shapes), f"{name}: router [8, H] x 4: {shapes}")
    out = dfl("bench", "--model", fixture("qwen35_moe_vlm"), "--drafter", "none", "--parts", "products", *SMALL).stdout
    t.check("all, in order" in out and "x1 at n=16" in out and "96 routed experts' matrices left out" in out,
            f"products table: {out}")


def check_moe(t):
    """MoE target: the verify curve names the distinct experts touched per sparse layer (k at n = 1,
    never fewer than the previous n, at most min(n k, E)) and the weight bytes read (the decode
    figure at n = 1, growing by whole experts)."""
    r = bench_json("--model", fixture("qwen35_moe_vlm"), "--drafter", "none", "--parts", "decode,verify")
    moe, ex, by = r.get("moe", {}), r.get("verify_experts_per_layer", []), r.get("verify_weight_bytes", [])
    E, k, L = moe.get("experts"), moe.get("experts_per_tok"), moe.get("sparse_layers")
    t.check((E, k, L) == (8, 2, 4) and len(ex) == len(by) == 5, f"moe {moe}, {ex}, {by}")
    t.check(ex and ex[0] == k and all(b >= a for a, b in zip(ex, ex[1:])) and
            all(x <= min((n + 1) * k, E) for n, x in enumerate(ex)), f"experts per layer {ex}")
    t.check(by and by[0] == r["token_bytes"] and
            all(b - by[0] == round((x - k) * L) * moe["expert_bytes"] for x, b in zip(ex, by)), f"bytes {by}")
    out = dfl("bench", "--model", fixture("qwen35_moe_vlm"), "--drafter", "none", "--parts", "verify", *SMALL).stdout
    t.check("experts/layer (of 8, k 2)" in out, f"table: {out}")
    dense = bench_json("--model", fixture("qwen3_tiny"), "--drafter", "none", "--parts", "verify")
    t.check("moe" not in dense and "verify_experts_per_layer" not in dense, "no MoE fields for a dense target")


def check_e2e_prompt(t):
    """e2e on a given prompt: the generated count, prompt length and tau are reported; without a
    drafter only the autoregressive run; a prompt with --parts leaving out e2e is refused."""
    r = bench_json("--model", fixture("qwen35_vlm"), "--drafter", fixture("dflash_qwen35"), "--parts", "e2e",
                   "--prompt-ids", "5,17,99,3,250")
    t.check(r["e2e_prompt"] == "given" and r["e2e_prompt_tokens"] == 5, f"e2e prompt fields {r}")
    t.check(1 <= r["e2e_generated"] <= 4 and r["spec_tau"] >= 1.0, f"e2e generated {r}")
    r = bench_json("--model", fixture("qwen35_vlm"), "--parts", "e2e", "--prompt-ids", "5,17")
    t.check("ar_tokens_per_s" in r and "spec_tokens_per_s" not in r, f"e2e without a drafter {r}")
    p = dfl("bench", "--model", fixture("qwen35_vlm"), "--parts", "decode", "--prompt-ids", "5", check=False)
    t.check(p.returncode == 2 and "e2e" in p.stderr, f"prompt without e2e: {p.returncode} {p.stderr}")
    p = dfl("bench", "--model", fixture("qwen35_vlm"), "--parts", "e2e", "--prompt-ids", "5,x", check=False)
    t.check(p.returncode != 0 and "--prompt-ids" in p.stderr, f"bad --prompt-ids: {p.returncode} {p.stderr}")


def check_isas(t):
    for isa in ("generic", "avx2", "avx512"):
        p = dfl("bench", "--json", "--isa", isa, "--parts", "decode", "--model", fixture("qwen35_bf16"), *SMALL,
                check=False)
        if p.returncode == 0:
            t.check(json.loads(p.stdout)["isa"] == isa, f"--isa {isa} is used")
        else:
            t.check("not supported" in p.stderr, f"--isa {isa}: {p.stderr}")
    p = dfl("bench", "--json", "--act", "bf16", "--parts", "decode,verify", "--model", fixture("qwen35_bf16"), *SMALL,
            check=False)
    if p.returncode == 0:
        t.check(json.loads(p.stdout)["act"] == "bf16", "--act bf16 is used")
    else:
        t.check("AVX-512 BF16" in p.stderr, f"--act bf16 without AVX-512 BF16 names it: {p.stderr}")


def check_errors(t):
    p = dfl("bench", "--parts", "decode,nothing", check=False)
    t.check(p.returncode == 2 and "--parts" in p.stderr and "peak, profile, products" in p.stderr,
            f"bad --parts names every part: {p.returncode} {p.stderr}")
    p = dfl("bench", "--isa", "sse9", check=False)
    t.check(p.returncode == 2 and "sse9" in p.stderr, f"bad --isa: {p.returncode} {p.stderr}")
    p = dfl("bench", "--model", "/nonexistent", check=False)
    t.check(p.returncode == 1, f"missing model: {p.returncode}")
    p = dfl("bench", "--model", fixture("qwen3_tiny"), "--drafter", fixture("dflash_qwen35"), check=False)
    t.check(p.returncode == 1 and "drafter" in p.stderr, f"mismatched drafter: {p.returncode} {p.stderr}")


def check_run_script(t):
    env = dict(os.environ, DFL_BIN=DFL, DFL_PYTHON=PY)
    p = run([os.path.join(SOURCE, "bench", "run"), "--json", "--threads", "1", "--no-extra", "--dtypes", "fp32",
             "--model", fixture("qwen35_text"), "--drafter", "none", *SIZES], env=env)
    r = json.loads(p.stdout)
    for key in ("speedup_vs_transformers_decode", "speedup_vs_transformers_prefill",
                "speedup_vs_transformers_decode_fp32", "transformers"):
        t.check(key in r, f"bench/run --json has {key}")
    t.check(r["transformers"]["fp32"]["decode_tokens_per_s"] > 0, "torch decode measured")


def check_peer_llamacpp(t):
    """bench/peer-llamacpp (downloads and builds, so never run here): its help, bad options, a
    clear failure with no package index reachable, and the pre-tokenizer check that lets the
    embedded tokenizer through llama.cpp's converter."""
    script = os.path.join(SOURCE, "bench", "peer-llamacpp")
    p = run([PY, script, "--help"])
    t.check("llama-cpp-python" in p.stdout and "--rounds" in p.stdout, f"--help: {p.stdout[:200]}")
    p = run([PY, script, "--threads", "0"], check=False)
    t.check(p.returncode == 2 and "--threads" in p.stderr, f"--threads 0: {p.returncode} {p.stderr}")
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=work)
        p = run([PY, script, "--work", work, "--setup-only"], check=False, env=env)
        t.check(p.returncode == 1 and "could not download llama-cpp-python" in p.stderr and "Traceback" not in p.stderr,
                f"offline: {p.returncode} {p.stderr[-500:]}")
    loader = importlib.machinery.SourceFileLoader("peer_llamacpp", script)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    t.check(mod.tokenizer_pre(os.path.join(SOURCE, "models", "target", "tokenizer.json")) == "qwen2",
            "the embedded tokenizer pre-tokenizes as Qwen's")
    with tempfile.TemporaryDirectory() as d:
        tj = json.load(open(os.path.join(SOURCE, "models", "target", "tokenizer.json")))
        tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"
        json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w"))
        t.check(mod.tokenizer_pre(os.path.join(d, "tokenizer.json")) is None, "another regex is not called qwen2")
    # the summary and table from two synthetic rounds (with dfl's bf16-activation runs and the tree)
    vms = [50.0 + 4 * i for i in range(32)]
    tree = [{"budget": 64, "depth": 9, "tree_ms": 400.0, "chain_ms": 410.0}]
    rounds = [{"load_before": "0.5", "dfl": {"probe_gbps": 30.0, "decode_tokens_per_s": 19.0, "prefill_tokens_per_s": 150.0,
                                             "verify_ms": vms, "token_bytes": 1.5e9, "decode_vs_probe_paired": 0.9,
                                             "tree": tree,
                                             "bf16": {"prefill_tokens_per_s": 250.0, "verify_ms": vms[::-1], "tree": tree}},
               "llama": {"pp": {"samples_ts": [160.0]}, "tg": {"samples_ts": [18.0]},
                         "verify": {"decode_median_ms": 55.0, "verify_ms": vms}}}] * 2
    meta = {"date": "d", "machine": "m", "threads": 2, "dfl_isa": "avx512", "load_before": "0.5", "load_after": "0.6",
            "llamacpp": "x", "wall_s": 1.0, "command": "c"}
    md = mod.table(mod.summarize(None, rounds, None, meta))
    t.check("dfl `--act bf16`" in md and "| 90% |" in md and "**1.56x**" in md and "| 95% (0.95, 0.95) |" in md,
            f"peer table with the bf16-activation rows: {md}")


def main():
    t = Tally("test_bench")
    t.run(check_full, t)
    t.run(check_drafter_kinds, t)
    t.run(check_replay_part, t)
    t.run(check_big_model_holes, t)
    t.run(check_tree, t)
    t.run(check_moe, t)
    t.run(check_profile, t)
    t.run(check_products, t)
    t.run(check_e2e_prompt, t)
    t.run(check_isas, t)
    t.run(check_errors, t)
    t.run(check_run_script, t)
    t.run(check_peer_llamacpp, t)
    t.done()


if __name__ == "__main__":
    main()
