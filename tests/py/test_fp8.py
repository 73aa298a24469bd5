"""Fine-grained FP8 targets (docs/fp8.md): F8_E4M3 weights with a weight_scale_inv per block, as
the released "-FP8" checkpoints store them, written here from BF16 checkpoints by
tools/make_fp8.py.

- Layout: the qwen3_fp8 / qwen35_fp8 fixtures hold what the released checkpoints hold
  (quantization_config, F8_E4M3 linear weights of the decoder layers, BF16 scales of shape
  [ceil(out/128), ceil(in/128)], embeddings, lm_head, norms, conv1d, in_proj_a/b, vision and mtp
  unquantized and listed in modules_to_not_convert).
- Reference: dfl on the FP8 checkpoint vs transformers on the same weights dequantized to float32
  (`make_fp8.py --dequantize`): logits and every layer within 1e-4 relative (`dfl hidden-diff`),
  64 greedy tokens identical; blocks of 128 x 128 (with cut-short last blocks), 5 x 24 (the
  generic kernel) with F32 scales and 32 x 64; the generic, AVX2 and default paths; MoE targets
  (Qwen3 and Qwen3.5, experts per expert, shared expert) converted the same way.
- An FP8 checkpoint whose MTP head is quantized too: `--drafter mtp` lossless, drafts accepted.
- FP8 vs BF16: `dfl hidden-diff` reports a nonzero difference within sane bounds: on the trained
  embedded target every layer and the logits move by 0.5-2% of their scale (bound 5%); on the
  random-weight fixtures, whose hybrid layers amplify the 2.6% RMS weight error, by 8-50%
  (bound 75%: the same model, not noise).
- Speculative decoding on the FP8 embedded target: greedy output equals autoregressive (chain and
  DDTree); `dfl eval` on the BF16 and FP8 targets, then dfl eval-compare puts their tau side
  by side (both printed).
- inspect reports the quantization (text and --json); bad input is refused naming the file,
  tensor or field with expected vs found (no sanitizer report with DFL_BIN pointing at an ASan
  build)."""
import json
import os
import shutil
import tempfile

import torch
from safetensors import safe_open
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch, save_file as save_torch

from dfltest import PY, SOURCE, Tally, dfl, dfl_json, fixture, reference, run

MAKE_FP8 = os.path.join(SOURCE, "tools", "make_fp8.py")
EMB_TARGET, EMB_DRAFTER = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
ST = "model.safetensors"
GREEDY = 64
t = Tally("fp8")
tmp = tempfile.mkdtemp(prefix="dfl-fp8-")


def make_fp8(*args):
    run([PY, MAKE_FP8, *map(str, args)])


def converted(src, name, *opts):
    d = os.path.join(tmp, name)
    if not os.path.exists(d):
        make_fp8(src, d, *opts)
    return d


def layout():
    for name in ("qwen3_fp8", "qwen35_fp8"):
        d = fixture(name)
        with open(os.path.join(d, "config.json")) as f:
            q = json.load(f)["quantization_config"]
        t.check(q["quant_method"] == "fp8" and q["fmt"] == "e4m3" and q["activation_scheme"] == "dynamic"
                and q["weight_block_size"] == [128, 128], f"{name}: quantization_config {q}")
        with safe_open(os.path.join(d, ST), "pt") as f:
            x = {k: f.get_tensor(k) for k in f.keys()}
        fp8 = [k for k, v in x.items() if v.dtype == torch.float8_e4m3fn]
        t.check(len(fp8) > 0 and all(".layers." in k and not k.startswith("mtp.") for k in fp8),
                f"{name}: F8_E4M3 outside the decoder layers: {fp8}")
        for k in fp8:
            s = x.get(k + "_scale_inv")
            rows, cols = x[k].shape
            t.check(s is not None and s.dtype == torch.bfloat16 and list(s.shape) == [-(-rows // 128), -(-cols // 128)],
                    f"{name}: {k}_scale_inv {None if s is None else (s.dtype, list(s.shape))}")
        keep = ("embed_tokens", "lm_head", "norm", "conv1d", "in_proj_a", "in_proj_b", "A_log", "dt_bias", "visual")
        t.check(not any(p in k for k in fp8 for p in keep), f"{name}: a module released checkpoints keep is FP8")
        t.check("lm_head" in q["modules_to_not_convert"] and
                all(m.split(".")[-1] not in ("q_proj", "gate_proj") or m.startswith(("mtp.", "model.visual."))
                    for m in q["modules_to_not_convert"]), f"{name}: modules_to_not_convert {q['modules_to_not_convert']}")


def vs_transformers(d, T, greedy=False, isas=(None,)):
    """dfl on FP8 checkpoint d (on each instruction-set path in isas; None: the default one) vs
    transformers on its float32 dequantization."""
    deq = os.path.join(tmp, os.path.basename(d) + "-deq")
    make_fp8("--dequantize", d, deq)
    ref_path = os.path.join(tmp, f"{os.path.basename(d)}-{T}-ref.safetensors")
    summary = reference("--model", deq, "--random-len", T, "--seed", T, "--out", ref_path,
                        *(["--greedy", GREEDY] if greedy else []))
    ids = ",".join(str(int(x)) for x in load_file(ref_path)["input_ids"])
    for isa in isas:
        tag = f"{os.path.basename(d)} T={T} {isa or 'default path'}"
        out_path = os.path.join(tmp, f"{os.path.basename(d)}-{T}-{isa}-dfl.safetensors")
        env = dict(os.environ, **({"DFL_ISA": isa} if isa else {}))
        dfl("hidden", "--target", d, "--layers", "all", "--prompt-ids", ids, "--out", out_path, "--logits", env=env)
        diff = dfl_json("hidden-diff", out_path, ref_path, "--tol", 1e-4, "--json")
        t.check(diff["ok"] and diff["compared"] == summary["L"] + 1,
                f"{tag}: beyond 1e-4: {[x for x in diff['tensors'] if x['first_bad'] >= 0]}")
        print(f"{tag}: {diff['compared']} tensors, worst rel {max(x['rel'] for x in diff['tensors']):.3g}", flush=True)
    if greedy:
        got = dfl_json("generate", "--target", d, "--prompt-ids", ids, "--max-new", GREEDY, "--ignore-eos",
                       "--json")["tokens"]
        t.check(got == summary["greedy"], f"{tag}: greedy tokens differ: dfl {got} vs transformers "
                                          f"{summary['greedy']} (min margin {summary['min_margin']})")


def mtp_head():
    """An FP8 checkpoint whose MTP head is quantized too: speculative decoding with it is lossless
    and its drafts are accepted (the fitted head of qwen35_mtp)."""
    d = converted(fixture("qwen35_mtp"), "qwen35_mtp-fp8", "--quantize-mtp")
    with safe_open(os.path.join(d, ST), "pt") as f:
        t.check(f.get_slice("mtp.fc.weight").get_dtype() == "F8_E4M3", "mtp.fc.weight quantized")
    accepted = {}
    for ids in ("11,200,37,512,99,3,641,77,12", "5,6,7,8,9,10,11,12", "300,301,302"):
        base = ["generate", "--target", d, "--prompt-ids", ids, "--max-new", 40, "--ignore-eos", "--json"]
        greedy = dfl_json(*base)["tokens"]
        for extra in ([], ["--tree-budget", "8"]):
            g = dfl_json(*base, "--drafter", "mtp", *extra)
            t.check(g["tokens"] == greedy, f"FP8 MTP {ids} {extra}: speculative output != greedy")
            accepted[(ids, *extra)] = g["stats"]["accepted"]
    # the head was fitted on the F32 target's continuations: on the FP8 one it still gets drafts
    # accepted, though not on every prompt
    t.check(sum(accepted.values()) > 0, f"FP8 MTP: no draft accepted anywhere: {accepted}")
    print(f"FP8 MTP head: accepted drafts {accepted}", flush=True)


def fp8_vs_bf16(fp8, bf16, bound):
    ids = ",".join(str(i) for i in range(5, 300, 6))
    tag = os.path.basename(fp8)
    a, b = os.path.join(tmp, f"{tag}-fp8-h.safetensors"), os.path.join(tmp, f"{tag}-bf16-h.safetensors")
    for d, out in ((fp8, a), (bf16, b)):
        dfl("hidden", "--target", d, "--layers", "all", "--prompt-ids", ids, "--out", out, "--logits")
    p = dfl("hidden-diff", a, b, "--json", check=False)
    diff = json.loads(p.stdout)
    rels = [x["rel"] for x in diff["tensors"]]
    # FP8 keeps 3 mantissa bits (each weight within 2^-4 of its value): a 1e-4 tolerance flags
    # every tensor from the first position on
    t.check(p.returncode == 1 and not diff["ok"] and all(x["first_bad"] == 0 for x in diff["tensors"]),
            f"{tag} vs BF16: hidden-diff at 1e-4 should report every tensor: {diff}")
    t.check(len(rels) > 1 and all(1e-4 < r < bound for r in rels), f"{tag} vs BF16: relative errors {rels}")
    print(f"{tag} vs BF16: relative error per tensor {', '.join(f'{r:.3g}' for r in rels)}", flush=True)
    t.check(dfl_json("hidden-diff", a, b, "--tol", 1, "--json")["ok"], f"{tag} vs BF16: beyond tolerance 1")


def inspect():
    j = dfl_json("inspect", fixture("qwen35_fp8"), "--json")
    q = j["quantization"]
    t.check(q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128] and q["fmt"] == "e4m3", f"{q}")
    # 4 linear layers x (in_proj_qkv, in_proj_z, out_proj) + 2 full x (q, k, v, o) + 6 MLPs x 3
    t.check(q["quantized_weights"] == 38 and q["scale_tensors"] == 38, f"quantized counts {q}")
    t.check(q["quantized_bytes"] > 0 and q["unquantized_tensors"] > 0 and j["dtypes"].get("F8_E4M3") == 38, f"{j}")
    out = dfl("inspect", fixture("qwen3_fp8")).stdout
    t.check("quantization: fp8 (fmt e4m3" in out and "weight_block_size 128 x 128" in out and "35 F8_E4M3 weights" in out,
            f"inspect text: {out}")
    t.check(dfl_json("inspect", fixture("qwen3_bf16"), "--json")["quantization"] is None, "BF16: quantization null")
    t.check("quantization: none" in dfl("inspect", fixture("qwen3_bf16")).stdout, "BF16: quantization none")
    dfl("inspect", fixture("qwen35_fp8"), "--check-weights")


def speculative():
    target = converted(EMB_TARGET, "embedded-fp8")
    q = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " \
        "How many clips did Natalia sell altogether in April and May?"
    base = ["generate", "--target", target, "--prompt", q, "--chat", "chatml", "--max-new", 96, "--json"]
    ar = dfl_json(*base)["tokens"]
    for extra in ([], ["--tree-budget", 8]):
        r = dfl_json(*base, "--drafter", EMB_DRAFTER, *extra)
        t.check(r["tokens"] == ar, f"FP8 target {extra}: speculative output differs from autoregressive")
        t.check(r["stats"]["tau"] > 1.5, f"FP8 target {extra}: tau {r['stats']['tau']} (the drafter should be accepted)")
    outs = [os.path.join(tmp, "eval-bf16"), os.path.join(tmp, "eval-fp8")]
    for tg, out in zip((EMB_TARGET, target), outs):
        dfl("eval", "--target", tg, "--drafter", EMB_DRAFTER, "--prompts", os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl"),
            "--limit", 6, "--max-new", 96, "--tree-budget", "0,8", "--check-ar", "--out", out, "--progress", "none")
    p = dfl("eval-compare", *outs, "--json")
    cmp = json.loads(p.stdout)
    rows = cmp["rows"]
    t.check([r["target"] for r in cmp["runs"]] == [EMB_TARGET, target], f"eval-compare runs {cmp['runs']}")
    t.check(sorted((r["mode"], r["method"]) for r in rows) == [("chain", "online"), ("chain", "replay"), ("ddtree-8", "replay")]
            and all(min(r["tau"]) > 1.5 and r["mismatches"] == [0, 0] for r in rows), f"eval-compare rows {rows}")
    for r in rows:
        t.check(abs(r["change_percent"][0] - 100 * (r["tau"][1] / r["tau"][0] - 1)) < 1e-6, f"change of {r}")
        print(f"embedded drafter {r['mode']} ({r['method']}): tau BF16 {r['tau'][0]:.3f}, FP8 {r['tau'][1]:.3f} "
              f"({r['change_percent'][0]:+.1f}%)", flush=True)
    table = dfl("eval-compare", *outs).stdout
    t.check(table.startswith("| drafter | mode | τ (token-weighted) ") and "| chain (online) |" in table,
            f"eval-compare table: {table}")
    p = dfl("eval-compare", outs[0], check=False)
    t.check(p.returncode == 2 and "at least two" in p.stderr, f"eval-compare with one run: {p.returncode} {p.stderr}")
    other = os.path.join(tmp, "eval-other")  # other options: refused, naming the field
    dfl("eval", "--target", target, "--drafter", EMB_DRAFTER, "--prompts", os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl"),
        "--limit", 6, "--max-new", 32, "--out", other, "--progress", "none")
    p = dfl("eval-compare", outs[0], other, check=False)
    t.check(p.returncode == 1 and "run.max_new differs" in p.stderr, f"eval-compare of other options: {p.stderr}")
    p = dfl("eval-compare", outs[0], os.path.join(tmp, "nowhere"), check=False)
    t.check(p.returncode == 1 and "summary.json: cannot read" in p.stderr, f"eval-compare of a missing run: {p.stderr}")


def bad_input():
    src = fixture("qwen3_fp8")
    w = "model.layers.1.mlp.down_proj.weight"

    def variant(name, cfg_edit=None, st_edit=None):
        d = os.path.join(tmp, name)
        shutil.copytree(src, d)
        if cfg_edit:
            p = os.path.join(d, "config.json")
            with open(p) as f:
                c = json.load(f)
            cfg_edit(c["quantization_config"], c)
            with open(p, "w") as f:
                json.dump(c, f)
        if st_edit:
            x = load_torch(os.path.join(d, ST))
            st_edit(x)
            save_torch(x, os.path.join(d, ST), metadata={"format": "pt"})
        return d

    def refused(d, *needles):
        for args in (["inspect", d], ["generate", "--target", d, "--prompt-ids", "1,2,3", "--max-new", 2]):
            p = dfl(*args, check=False)
            t.check(p.returncode == 1 and all(n in p.stderr for n in needles) and "Sanitizer" not in p.stderr
                    and "runtime error:" not in p.stderr,
                    f"{os.path.basename(d)} {args[0]}: exit {p.returncode}, expected {needles} in: {p.stderr[-500:]}")

    for method in ("gptq", "awq"):
        refused(variant(f"method-{method}", lambda q, c: q.update(quant_method=method)),
                "config.json: quantization_config.quant_method: expected \"fp8\"", f'found "{method}"')
    refused(variant("fmt", lambda q, c: q.update(fmt="e5m2")), "quantization_config.fmt: expected \"e4m3\"",
            'found "e5m2"')
    refused(variant("static", lambda q, c: q.update(activation_scheme="static")),
            "quantization_config.activation_scheme: expected \"dynamic\"", 'found "static"')
    refused(variant("no-block", lambda q, c: q.pop("weight_block_size")), "quantization_config.weight_block_size: missing")
    refused(variant("bad-block", lambda q, c: q.update(weight_block_size=[128, 0])),
            "quantization_config.weight_block_size: expected two integers", "found [128,0]")
    refused(variant("qc-list", lambda q, c: c.update(quantization_config=[1])),
            "quantization_config: expected an object, found [1]")
    refused(variant("no-qc", lambda q, c: c.pop("quantization_config")),
            "has dtype F8_E4M3 but config.json has no quantization_config", "model.layers.")
    refused(variant("no-scale", st_edit=lambda x: x.pop(w + "_scale_inv")),
            f"missing tensor '{w}_scale_inv' (expected shape [1, 2], F32 or BF16", "weight_block_size [128, 128]")
    refused(variant("scale-shape", st_edit=lambda x: x.__setitem__(w + "_scale_inv", x[w + "_scale_inv"][:, :1].clone())),
            f"'{w}_scale_inv' has shape [1, 1], expected [1, 2]", "ceil(96 / 128), ceil(192 / 128)")
    refused(variant("scale-dtype", st_edit=lambda x: x.__setitem__(w + "_scale_inv", x[w + "_scale_inv"].to(torch.int32))),
            f"'{w}_scale_inv' has dtype I32; expected F32, BF16 or F16")
    def scale_at(x, v):  # the first block's multiplier set to v
        s = x[w + "_scale_inv"].clone()
        s.view(-1)[0] = v
        x[w + "_scale_inv"] = s
    refused(variant("scale-neg", st_edit=lambda x: scale_at(x, -3e38)),
            f"'{w}_scale_inv' block [0, 0] holds -3", "expected a finite multiplier >= 0")
    refused(variant("scale-inf", st_edit=lambda x: scale_at(x, float("inf"))),
            f"'{w}_scale_inv' block [0, 0] holds inf; expected a finite multiplier >= 0")
    refused(variant("not-convert", lambda q, c: q["modules_to_not_convert"].append("model.layers.1.mlp.down_proj")),
            f"'{w}' has dtype F8_E4M3 but", "lists module 'model.layers.1.mlp.down_proj' in "
            "quantization_config.modules_to_not_convert")
    norm = "model.layers.0.input_layernorm.weight"
    refused(variant("f8-norm", st_edit=lambda x: x.__setitem__(norm, x[norm].to(torch.float8_e4m3fn))),
            f"'{norm}' has dtype F8_E4M3; FP8 checkpoints quantize linear weights only")
    drafter = os.path.join(tmp, "drafter-f8")
    shutil.copytree(fixture("dflash_qwen3"), drafter)
    x = load_torch(os.path.join(drafter, ST))
    x["fc.weight"] = x["fc.weight"].to(torch.float8_e4m3fn)
    save_torch(x, os.path.join(drafter, ST), metadata={"format": "pt"})
    p = dfl("inspect", drafter, "--target", fixture("qwen3_tiny"), check=False)
    t.check(p.returncode == 1 and "'fc.weight' has dtype F8_E4M3 but dfl reads FP8 weights in target models only"
            in p.stderr, f"F8 drafter: {p.returncode} {p.stderr[-400:]}")
    nan = variant("nan-code", st_edit=lambda x: x[w].view(torch.uint8).view(-1).__setitem__(5, 0x7F))
    p = dfl("inspect", nan, "--check-weights", check=False)
    t.check(p.returncode == 1 and f"'{w}': 1 non-finite value (1 NaN, 0 Inf)" in p.stderr,
            f"NaN code: --check-weights {p.returncode}: {p.stderr[-400:]}")


t.run(layout)
t.run(vs_transformers, fixture("qwen3_fp8"), 130, True)
t.run(vs_transformers, fixture("qwen35_fp8"), 100, True, (None, "generic", "avx2"))
t.run(vs_transformers, converted(fixture("qwen3_bf16"), "qwen3-b5x24", "--block", "5,24", "--scale-dtype", "f32"), 40)
t.run(vs_transformers, converted(fixture("qwen35_bf16"), "qwen35-b32x64", "--block", "32,64"), 70)
# mixture of experts, experts stored per expert (the released FP8 MoE layout): routed and shared
# experts quantized, routers and the shared expert's gate not
t.run(vs_transformers, converted(fixture("qwen3_moe_bf16"), "qwen3_moe-fp8"), 40, True)
t.run(vs_transformers, converted(fixture("qwen35_moe_vlm"), "qwen35_moe-fp8", "--block", "16,32"), 30)
t.run(mtp_head)
t.run(fp8_vs_bf16, fixture("qwen3_fp8"), fixture("qwen3_bf16"), 0.75)
t.run(fp8_vs_bf16, fixture("qwen35_fp8"), fixture("qwen35_bf16"), 0.75)
t.run(fp8_vs_bf16, converted(EMB_TARGET, "embedded-fp8"), EMB_TARGET, 0.05)
t.run(inspect)
t.run(speculative)
t.run(bad_input)
t.done()
