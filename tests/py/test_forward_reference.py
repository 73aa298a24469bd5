"""dfl's target forward against Hugging Face transformers (CPU, eager, float32).

For every fixture and several prompt lengths (1 to 200, crossing transformers' 64-token
chunk of the gated-delta rule): logits and every decoder layer's output within tolerance
(`dfl hidden-diff`), and 64 greedy tokens identical. The VLM-layout and text-layout
checkpoints of the same weights must give bit-identical numbers in dfl, and so must the MoE
checkpoints whose experts are stored per expert (save_pretrained) and fused (released Qwen3.5 MoE).
DFL_FORWARD_ONLY=name,name runs just those fixtures (and the layout checks that use them; big_moe:
tools/make_big_model.py's tiny-moe shape, hand-written with fused experts, against transformers)."""
import os
import tempfile

from safetensors.numpy import load_file

from dfltest import PY, SOURCE, Tally, dfl, dfl_json, fixture, reference, run

# (fixture, prompt lengths, tolerance). BF16 fixtures: weights are BF16 in both engines and
# upcast to float32, so the same float32 tolerance holds (measured max rel ~2e-5).
CASES = [
    ("qwen3_tiny", [1, 17, 200], 1e-4),
    ("qwen3_bf16", [5, 130], 1e-4),
    ("qwen35_vlm", [1, 64, 65, 200], 1e-4),
    ("qwen35_text", [33], 1e-4),
    ("qwen35_bf16", [2, 100], 1e-4),
    ("qwen35_r1", [1, 70], 1e-4),
    ("qwen35_sharded", [40], 1e-4),
    ("qwen3_moe", [1, 50], 1e-4),
    ("qwen3_moe_bf16", [90], 1e-4),
    ("qwen35_moe_vlm", [1, 70], 1e-4),
    ("qwen35_moe_fused", [20], 1e-4),
    ("qwen3_moe_fused", [30], 1e-4),
]
ONLY = [x for x in os.environ.get("DFL_FORWARD_ONLY", "").split(",") if x]
GREEDY = 64

t = Tally("forward vs transformers")
tmp = tempfile.mkdtemp(prefix="dfl-fwd-")


def case(name, T, tol, greedy):
    ref_path = os.path.join(tmp, f"{name}-{T}-ref.safetensors")
    out_path = os.path.join(tmp, f"{name}-{T}-dfl.safetensors")
    summary = reference("--model", fixture(name), "--random-len", T, "--seed", T, "--out", ref_path,
                        *(["--greedy", GREEDY] if greedy else []))
    ids = ",".join(str(int(x)) for x in load_file(ref_path)["input_ids"])
    dfl("hidden", "--target", fixture(name), "--layers", "all", "--prompt-ids", ids, "--out", out_path, "--logits")
    diff = dfl_json("hidden-diff", out_path, ref_path, "--tol", tol, "--json")
    worst = max(x["rel"] for x in diff["tensors"])
    t.check(diff["ok"] and diff["compared"] == summary["L"] + 1,
            f"{name} T={T}: beyond tolerance {tol}: {[x for x in diff['tensors'] if x['first_bad'] >= 0]}")
    print(f"{name} T={T}: {diff['compared']} tensors, worst rel {worst:.3g}", flush=True)
    if greedy:
        got = dfl_json("generate", "--target", fixture(name), "--prompt-ids", ids, "--max-new", GREEDY,
                       "--ignore-eos", "--json")["tokens"]
        t.check(got == summary["greedy"], f"{name} T={T}: greedy tokens differ: dfl {got} vs transformers "
                                           f"{summary['greedy']} (min margin {summary['min_margin']})")


def layouts_identical(names):
    ids = ",".join(str(i) for i in range(3, 90, 2))
    outs = []
    for name in names:
        p = os.path.join(tmp, f"layout-{name}.safetensors")
        dfl("hidden", "--target", fixture(name), "--layers", "all", "--prompt-ids", ids, "--out", p, "--logits")
        outs.append(p)
    for other in outs[1:]:
        diff = dfl_json("hidden-diff", outs[0], other, "--tol", 0, "--json")
        t.check(diff["ok"] and all(x["max_abs"] == 0 for x in diff["tensors"]),
                f"VLM and {other} layouts are not bit-identical: {diff}")


def big_model_moe():
    """tools/make_big_model.py's MoE shapes (qwen3.6-35b-a3b, tested at tiny-moe's size): its
    hand-written safetensors with fused experts load in both engines and agree."""
    out = os.path.join(tmp, "big-tiny-moe")
    run([PY, os.path.join(SOURCE, "tools", "make_big_model.py"), out, "--shape", "tiny-moe", "--threads", "1",
         "--pool-from", "4096"])
    ref_path, out_path = os.path.join(tmp, "big-moe-ref.safetensors"), os.path.join(tmp, "big-moe-dfl.safetensors")
    summary = reference("--model", out, "--random-len", 40, "--seed", 3, "--out", ref_path, "--greedy", 16)
    ids = ",".join(str(int(x)) for x in load_file(ref_path)["input_ids"])
    dfl("hidden", "--target", out, "--layers", "all", "--prompt-ids", ids, "--out", out_path, "--logits")
    diff = dfl_json("hidden-diff", out_path, ref_path, "--tol", 1e-4, "--json")
    t.check(diff["ok"] and diff["compared"] == summary["L"] + 1, f"make_big_model tiny-moe: {diff}")
    got = dfl_json("generate", "--target", out, "--prompt-ids", ids, "--max-new", 16, "--ignore-eos", "--json")
    t.check(got["tokens"] == summary["greedy"], f"make_big_model tiny-moe greedy: {got['tokens']} vs {summary['greedy']}")


for name, lengths, tol in CASES:
    if ONLY and name not in ONLY:
        continue
    for i, T in enumerate(lengths):
        t.run(case, name, T, tol, i == len(lengths) - 1)
for names in (("qwen35_vlm", "qwen35_text", "qwen35_sharded"), ("qwen35_moe_vlm", "qwen35_moe_text", "qwen35_moe_fused"),
              ("qwen3_moe", "qwen3_moe_fused")):
    if not ONLY or names[0] in ONLY:
        t.run(layouts_identical, names)
if not ONLY or "big_moe" in ONLY:
    t.run(big_model_moe)
t.done()
