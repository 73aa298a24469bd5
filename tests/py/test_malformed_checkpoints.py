"""Malformed checkpoints through `dfl inspect`, `dfl inspect --check-weights` and `dfl generate`
(with and without --drafter): a copy of a fixture (Qwen3 dense, Qwen3.5 hybrid, MoE, sharded, a drafter)
is damaged in a temp dir and run through the real binary. Each case must end with a non-zero exit
and a message naming the file, the tensor or field and the expected vs found values; never a
signal, never a sanitizer report (point DFL_BIN at an ASan build to check that), never a silent
wrong answer. The cases that must work (a good checkpoint, NaN only where the forward never reads)
must exit 0.

Cases: truncated model.safetensors (in the header; in the data, so the last tensors' data_offsets
run past the end), offsets past the end edited into the header, a header length beyond the file,
shards (missing shard, a tensor absent from its shard, mapped to the wrong shard, a truncated
shard), NaN / Inf weights (F32 and BF16; --check-weights names every tensor with its count of
non-finite values; generate stops at the first non-finite logits, naming the position and
pointing to --check-weights), shape vs config (hidden_size, q_proj, vocab_size, a drafter's fc vs
its target_layer_ids), unsupported dtypes (I8, F8_E4M3 without a quantization_config: test_fp8 has the
FP8 cases; F16 is fine), missing tensors, a drafter
that does not fit its target."""
import json
import os
import shutil
import signal
import struct
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from safetensors.torch import load_file as load_torch, save_file as save_torch

from dfltest import DFL, Tally, dfl, fixture, st_read_raw, st_write_raw

t = Tally("malformed checkpoints")
tmp = tempfile.mkdtemp(prefix="dfl-malformed-")
ST = "model.safetensors"
PROMPT = ["--prompt-ids", "1,2,3,4,5", "--max-new", "4"]
SANITIZER = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")


def copy_fixture(name, new):
    d = os.path.join(tmp, new)
    shutil.copytree(fixture(name), d)
    return d


def run(args):
    p = dfl(*args, check=False)
    what = " ".join(map(str, args)).replace(tmp + "/", "")
    t.check(p.returncode >= 0, f"{what}: killed by signal {signal.Signals(-p.returncode).name if p.returncode < 0 else ''}")
    t.check(not any(s in p.stderr for s in SANITIZER), f"{what}: sanitizer report: {p.stderr[-2000:]}")
    return p, what


def expect_fail(args, *needles):
    """A clean failure: exit code 1 (2 is for usage errors), every needle in stderr."""
    p, what = run(args)
    t.check(p.returncode == 1, f"{what}: expected exit 1, got {p.returncode}: {p.stderr[-600:]}")
    for n in needles:
        t.check(n in p.stderr, f"{what}: message lacks {n!r}: {p.stderr[-600:]}")
    return p


def expect_ok(args, *needles):
    p, what = run(args)
    t.check(p.returncode == 0, f"{what}: expected success, got {p.returncode}: {p.stderr[-600:]}")
    for n in needles:
        t.check(n in p.stdout + p.stderr, f"{what}: output lacks {n!r}: {(p.stdout + p.stderr)[-600:]}")
    return p


def both(d, *needles, drafter=None):
    """A damaged target (or drafter) fails the same way in inspect and generate."""
    if drafter:
        expect_fail(["inspect", drafter, "--target", d], *needles)
        expect_fail(["generate", "--target", d, "--drafter", drafter, *PROMPT], *needles)
    else:
        expect_fail(["inspect", d], *needles)
        expect_fail(["generate", "--target", d, *PROMPT], *needles)


def read_header(path):
    return st_read_raw(path)[:2]


def data_of(path):
    n, _ = read_header(path)
    with open(path, "rb") as f:
        f.seek(8 + n)
        return f.read()


def by_offset(hdr):
    return sorted((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][0])


def poke(path, name, elems, values):
    """Overwrite elements of one tensor in place (F32 or BF16), bit patterns from float32 values."""
    n, hdr = read_header(path)
    e = hdr[name]
    size = {"F32": 4, "BF16": 2, "F16": 2}[e["dtype"]]
    with open(path, "r+b") as f:
        for i, v in zip(elems, values):
            b = struct.pack("<f", v)
            f.seek(8 + n + e["data_offsets"][0] + i * size)
            f.write(b if size == 4 else b[2:] if e["dtype"] == "BF16" else np.float16(v).tobytes())


def edit_config(d, fn, text_config=False):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    fn(cfg["text_config"] if text_config else cfg)
    json.dump(cfg, open(p, "w"), indent=2)


def resave(d, fn, path=ST):
    """Load with safetensors.numpy, let fn edit the dict, save it back (a valid file)."""
    p = os.path.join(d, path)
    x = dict(load_file(p))
    fn(x)
    save_file(x, p, metadata={"format": "pt"})


# --- the cases that must work -------------------------------------------------------------------

def good():
    for name in ("qwen3_tiny", "qwen3_bf16", "qwen35_text", "qwen35_vlm", "qwen35_sharded", "qwen3_moe",
                 "qwen35_moe_fused"):
        expect_ok(["inspect", fixture(name), "--check-weights"])
        expect_ok(["inspect", fixture(name), "--check-weights", "--json"])
    expect_ok(["inspect", fixture("qwen3_tiny"), "--check-weights"], "every tensor the forward reads is finite")
    expect_ok(["inspect", fixture("dflash_qwen3"), "--check-weights"], "every tensor the forward reads is finite")
    expect_ok(["inspect", fixture("dflash_qwen3"), "--target", fixture("qwen3_tiny"), "--check-weights"])
    expect_ok(["generate", "--target", fixture("qwen3_tiny"), *PROMPT, "--check-weights"])
    expect_ok(["generate", "--target", fixture("qwen3_tiny"), "--drafter", fixture("dflash_qwen3"), *PROMPT,
               "--check-weights"])
    # a speculative run shorter than the drafter's block (max_new 4 < block 16; 3 < 8)
    for tg, dr in (("qwen35_text", "dflash_qwen35"), ("qwen3_tiny", "dflash_qwen3")):
        for mn in ("1", "3"):
            expect_ok(["generate", "--target", fixture(tg), "--drafter", fixture(dr), "--prompt-ids", "1,2",
                       "--max-new", mn, "--ignore-eos"])
    expect_ok(["generate", "--target", fixture("qwen35_text"), "--drafter", fixture("dflash_qwen35"),
               "--prompt-ids", "1,2", "--max-new", "3", "--tree-budget", "4"])


# --- truncation and offsets ---------------------------------------------------------------------

def truncated(name):
    hyb = name.startswith("qwen35")
    d = copy_fixture(name, f"{name}-cut-header")
    p = os.path.join(d, ST)
    n, hdr = read_header(p)
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(8 + n // 2)
    both(d, p, f"header length {n} is beyond the end of the file ({8 + n // 2} bytes)")

    d = copy_fixture(name, f"{name}-cut-tiny")
    p = os.path.join(d, ST)
    with open(p, "r+b") as f:
        f.truncate(5)
    both(d, p, "file is 5 bytes, too short")

    d = copy_fixture(name, f"{name}-empty")
    open(os.path.join(d, ST), "wb").close()
    both(d, os.path.join(d, ST), "file is 0 bytes")

    # cut in the data: the last tensors' data_offsets run past the end of the file
    for cut in (1, 1000 if not hyb else 300000):
        d = copy_fixture(name, f"{name}-cut-data-{cut}")
        p = os.path.join(d, ST)
        with open(p, "r+b") as f:
            f.truncate(size - cut)
        buf = size - cut - 8 - n
        first = next(k for k in hdr if k != "__metadata__" and hdr[k]["data_offsets"][1] > buf)
        end = hdr[first]["data_offsets"][1]
        both(d, p, f"tensor '{first}'", f"data_offsets end {end} beyond the data buffer ({buf} bytes)",
             "truncated")


def offsets():
    name = "qwen3_tiny"
    src = os.path.join(fixture(name), ST)
    n, hdr = read_header(src)
    data = data_of(src)
    last = by_offset(hdr)[-1]
    b, e = hdr[last]["data_offsets"]

    d = copy_fixture(name, "offsets-past-eof")
    h = json.loads(json.dumps(hdr))
    h[last]["data_offsets"] = [b + 10**6, e + 10**6]
    st_write_raw(os.path.join(d, ST), h, data)
    both(d, os.path.join(d, ST), f"tensor '{last}'", f"data_offsets end {e + 10**6} beyond the data buffer "
         f"({len(data)} bytes)")

    d = copy_fixture(name, "offsets-huge")
    h = json.loads(json.dumps(hdr))
    h[last]["data_offsets"] = [2**62, 2**62 + (e - b)]
    st_write_raw(os.path.join(d, ST), h, data)
    both(d, os.path.join(d, ST), f"tensor '{last}'", "invalid data_offsets [4611686018427387904")

    d = copy_fixture(name, "offsets-negative")
    h = json.loads(json.dumps(hdr))
    h[last]["data_offsets"] = [-4, e - b - 4]
    st_write_raw(os.path.join(d, ST), h, data)
    both(d, os.path.join(d, ST), f"tensor '{last}'", "invalid data_offsets [-4")

    d = copy_fixture(name, "offsets-span")
    h = json.loads(json.dumps(hdr))
    h[last]["data_offsets"] = [b, e + 4]
    st_write_raw(os.path.join(d, ST), h, data + b"\0" * 4)
    both(d, os.path.join(d, ST), f"tensor '{last}'", f"data_offsets span {e - b + 4} bytes, expected numel")

    d = copy_fixture(name, "shape-huge")
    h = json.loads(json.dumps(hdr))
    h[last]["shape"] = [2**40, 2**40]
    st_write_raw(os.path.join(d, ST), h, data)
    both(d, os.path.join(d, ST), f"tensor '{last}'", "shape overflows")

    for hlen, needle in ((len(json.dumps(hdr)) + len(data) + 1, "is beyond the end of the file"),
                         (2**63 + 5, "exceeds the limit of 100000000 bytes"),
                         (os.path.getsize(src) * 3, "is beyond the end of the file")):
        d = copy_fixture(name, f"hlen-{hlen}")
        st_write_raw(os.path.join(d, ST), hdr, data, hlen=hlen)
        both(d, os.path.join(d, ST), f"header length {hlen}", needle)

    d = copy_fixture(name, "hlen-short")  # header length cuts the JSON short
    st_write_raw(os.path.join(d, ST), hdr, data, hlen=len(json.dumps(hdr)) - 10)
    both(d, os.path.join(d, ST), "header is not valid JSON")


# --- shards -------------------------------------------------------------------------------------

def shards():
    idx_name = "model.safetensors.index.json"
    idx = json.load(open(os.path.join(fixture("qwen35_sharded"), idx_name)))
    files = sorted(set(idx["weight_map"].values()))

    d = copy_fixture("qwen35_sharded", "shard-missing")
    os.remove(os.path.join(d, files[2]))
    victim = next(k for k, v in idx["weight_map"].items() if v == files[2])
    both(d, os.path.join(d, idx_name), f"shard '{files[2]}'", "is missing", victim)

    # a tensor the index maps to a shard that does not hold it (nor any other)
    d = copy_fixture("qwen35_sharded", "shard-absent")
    name = "model.layers.5.linear_attn.A_log"
    shard = idx["weight_map"][name]
    resave(d, lambda x: x.pop(name), shard)
    both(d, os.path.join(d, idx_name), f"tensor '{name}'", f"shard {shard}", "not found")

    # mapped to one shard, stored in another
    d = copy_fixture("qwen35_sharded", "shard-wrong")
    other = next(f for f in files if f != shard)
    w = load_file(os.path.join(d, shard))[name]
    resave(d, lambda x: x.pop(name), shard)
    resave(d, lambda x: x.__setitem__(name, w), other)
    both(d, os.path.join(d, idx_name), f"tensor '{name}'", f"mapped to {shard} but stored in {other}")

    # a truncated shard names the shard file
    d = copy_fixture("qwen35_sharded", "shard-cut")
    p = os.path.join(d, files[-1])
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 16)
    both(d, p, "beyond the data buffer")

    # the index is not JSON / has no weight_map / names a path
    d = copy_fixture("qwen35_sharded", "shard-index-bad")
    with open(os.path.join(d, idx_name), "w") as f:
        f.write('{"weight_map": {"a": ')
    both(d, os.path.join(d, idx_name), "not valid JSON")
    d = copy_fixture("qwen35_sharded", "shard-index-path")
    j = json.loads(json.dumps(idx))
    j["weight_map"][name] = "../" + shard
    json.dump(j, open(os.path.join(d, idx_name), "w"))
    both(d, os.path.join(d, idx_name), f"'../{shard}'", "plain file name")


# --- NaN / Inf ----------------------------------------------------------------------------------

def nonfinite(name, tensor, elems, values, nan, inf):
    d = copy_fixture(name, f"nan-{name}")
    idx = os.path.join(d, "model.safetensors.index.json")
    path = os.path.join(d, json.load(open(idx))["weight_map"][tensor] if os.path.exists(idx) else ST)
    poke(path, tensor, elems, values)
    n_el = int(np.prod(read_header(path)[1][tensor]["shape"]))
    count = f"'{tensor}': {nan + inf} non-finite value{'s' if nan + inf > 1 else ''} ({nan} NaN, {inf} Inf) of {n_el}"
    # without the scan, inspect does not read the weights: it succeeds
    expect_ok(["inspect", d])
    p = expect_fail(["inspect", d, "--check-weights"], d, count, f"first at element {min(elems)}", f"in {path}")
    t.check(p.stdout == "", f"inspect --check-weights on {name}: prints a report for a bad checkpoint: {p.stdout}")
    expect_fail(["inspect", d, "--check-weights", "--json"], count)
    expect_fail(["generate", "--target", d, *PROMPT, "--check-weights"], count)
    # the default generate does not scan; the first non-finite logits stop it, naming the position
    p = expect_fail(["generate", "--target", d, *PROMPT], "target logits are not finite at position 4",
                    f"dfl inspect --check-weights {d}")
    t.check(p.stdout == "", f"generate on NaN {name} printed tokens: {p.stdout!r}")
    p = expect_fail(["generate", "--target", d, *PROMPT, "--json"], "not finite")
    t.check(p.stdout == "", f"generate --json on NaN {name} printed output: {p.stdout!r}")
    return d


def nan_targets():
    nonfinite("qwen3_tiny", "model.layers.3.mlp.gate_proj.weight", [7, 5 * 64 + 7, 100],
              [float("nan"), float("inf"), float("nan")], 2, 1)
    nonfinite("qwen3_bf16", "model.layers.1.self_attn.v_proj.weight", [33], [float("-inf")], 0, 1)
    d = nonfinite("qwen35_text", "model.layers.0.linear_attn.in_proj_qkv.weight", [0, 1, 2, 3],
                  [float("nan")] * 4, 4, 0)
    # a hybrid model: the speculative loop catches it as well (the target's logits, prefill)
    expect_fail(["generate", "--target", d, "--drafter", fixture("dflash_qwen35"), *PROMPT], "not finite")
    nonfinite("qwen35_sharded", "model.layers.7.mlp.down_proj.weight", [12], [float("inf")], 0, 1)
    # several tensors: every one is named
    d = copy_fixture("qwen3_tiny", "nan-several")
    poke(os.path.join(d, ST), "model.layers.0.self_attn.q_norm.weight", [3], [float("nan")])
    poke(os.path.join(d, ST), "model.norm.weight", [0, 1], [float("inf"), float("-inf")])
    expect_fail(["inspect", d, "--check-weights"], "2 tensors hold non-finite values",
                "'model.layers.0.self_attn.q_norm.weight': 1 non-finite", "'model.norm.weight': 2 non-finite")
    # NaN only where the text forward never reads (the VLM's vision tower): loads and runs
    d = copy_fixture("qwen35_vlm", "nan-vision")
    _, hdr = read_header(os.path.join(d, ST))
    vis = next(k for k in hdr if k.startswith("model.visual."))
    poke(os.path.join(d, ST), vis, [0], [float("nan")])
    expect_ok(["inspect", d, "--check-weights"])
    expect_ok(["generate", "--target", d, *PROMPT])
    # a NaN in the embedding row of a token the prompt never uses changes nothing: no error
    # (untied: with tied embeddings the row is also token 1000's lm_head row, and its logit is NaN)
    d = copy_fixture("qwen3_bf16", "nan-unused-row")
    poke(os.path.join(d, ST), "model.embed_tokens.weight", [1000 * 96 + 3], [float("nan")])
    expect_ok(["generate", "--target", d, "--prompt-ids", "1,2,3", "--max-new", "2", "--ignore-eos"])
    expect_fail(["inspect", d, "--check-weights"], "'model.embed_tokens.weight': 1 non-finite",
                f"first at element {1000 * 96 + 3} (row 1000, column 3)")
    d = copy_fixture("qwen3_tiny", "nan-tied-row")
    poke(os.path.join(d, ST), "model.embed_tokens.weight", [1000 * 64 + 3], [float("nan")])
    expect_fail(["generate", "--target", d, "--prompt-ids", "1,2,3", "--max-new", "2"],
                "target logits are not finite at position 2 (token 3; 1 of 1024 values: 1 NaN, 0 Inf)")


def nan_drafter():
    d = copy_fixture("dflash_qwen3", "nan-drafter")
    poke(os.path.join(d, ST), "layers.1.mlp.up_proj.weight", [9], [float("nan")])
    tiny = fixture("qwen3_tiny")
    expect_ok(["inspect", d])
    expect_fail(["inspect", d, "--check-weights"], "'layers.1.mlp.up_proj.weight': 1 non-finite")
    expect_fail(["inspect", d, "--target", tiny, "--check-weights"], "'layers.1.mlp.up_proj.weight': 1 non-finite")
    expect_fail(["generate", "--target", tiny, "--drafter", d, *PROMPT, "--check-weights"],
                "'layers.1.mlp.up_proj.weight': 1 non-finite")
    p = expect_fail(["generate", "--target", tiny, "--drafter", d, *PROMPT], "drafter logits are not finite",
                    f"dfl inspect --check-weights {d}")
    t.check(p.stdout == "", f"generate with a NaN drafter printed tokens: {p.stdout!r}")
    expect_fail(["generate", "--target", tiny, "--drafter", d, *PROMPT, "--tree-budget", "4"], "drafter logits")
    expect_fail(["generate", "--target", tiny, "--drafter", d, *PROMPT, "--temperature", "0.7", "--seed", "1"],
                "drafter logits")


# --- shape vs config, dtypes, missing tensors ---------------------------------------------------

def config_mismatch():
    tiny, hyb = "qwen3_tiny", "qwen35_text"
    d = copy_fixture(tiny, "cfg-hidden")
    edit_config(d, lambda c: c.update(hidden_size=96))
    both(d, "'model.embed_tokens.weight' has shape [1024, 64], expected [1024, 96]", "config.json",
         "hidden_size 96")

    d = copy_fixture("qwen35_vlm", "cfg-hidden-vlm")
    edit_config(d, lambda c: c.update(hidden_size=96), text_config=True)
    both(d, "'model.language_model.embed_tokens.weight' has shape [1024, 128], expected [1024, 96]",
         "hidden_size 96")

    d = copy_fixture(tiny, "cfg-vocab")
    edit_config(d, lambda c: c.update(vocab_size=2048))
    both(d, "'model.embed_tokens.weight' has shape [1024, 64], expected [2048, 64]", "vocab_size 2048")

    d = copy_fixture("qwen3_bf16", "cfg-vocab-untied")  # lm_head is checked too
    x = load_torch(os.path.join(d, ST))
    x["lm_head.weight"] = x["lm_head.weight"][:1000].contiguous()
    save_torch(x, os.path.join(d, ST), metadata={"format": "pt"})
    both(d, "'lm_head.weight' has shape [1000, 96], expected [1024, 96]", "vocab_size 1024")

    d = copy_fixture(tiny, "cfg-layers")
    edit_config(d, lambda c: c.update(num_hidden_layers=5))
    both(d, "missing tensor 'model.layers.4.input_layernorm.weight'", "num_hidden_layers 5")

    d = copy_fixture(tiny, "cfg-intermediate")
    edit_config(d, lambda c: c.update(intermediate_size=256))
    both(d, "'model.layers.0.mlp.gate_proj.weight' has shape [128, 64], expected [256, 64]", "intermediate_size 256")

    d = copy_fixture(tiny, "q-proj")
    resave(d, lambda x: x.__setitem__("model.layers.2.self_attn.q_proj.weight",
                                      x["model.layers.2.self_attn.q_proj.weight"][:96].copy()))
    both(d, os.path.join(d, ST), "'model.layers.2.self_attn.q_proj.weight' has shape [96, 64], expected [128, 64]",
         "num_attention_heads 4 x head_dim 32")

    # Qwen3.5 gated attention: q_proj holds query and gate (2 x heads x head_dim rows)
    d = copy_fixture(hyb, "q-proj-hybrid")
    resave(d, lambda x: x.__setitem__("model.layers.3.self_attn.q_proj.weight",
                                      x["model.layers.3.self_attn.q_proj.weight"][:256].copy()))
    both(d, "'model.layers.3.self_attn.q_proj.weight' has shape [256, 128], expected [512, 128]")

    d = copy_fixture(hyb, "cfg-linear-heads")
    edit_config(d, lambda c: c.update(linear_num_value_heads=8))
    both(d, "'model.layers.0.linear_attn.in_proj_qkv.weight'", "expected")

    d = copy_fixture(hyb, "conv-1d")  # conv1d weight stored 2-D
    resave(d, lambda x: x.__setitem__("model.layers.1.linear_attn.conv1d.weight",
                                      x["model.layers.1.linear_attn.conv1d.weight"][:, 0, :].copy()))
    both(d, "'model.layers.1.linear_attn.conv1d.weight' has shape [256, 4], expected [256, 1, 4]")


def dtypes():
    d = copy_fixture("qwen3_tiny", "dtype-i8")
    name = "model.layers.0.mlp.down_proj.weight"
    resave(d, lambda x: x.__setitem__(name, x[name].astype(np.int8)))
    both(d, os.path.join(d, ST), f"'{name}' has dtype I8", "supported: F32, F16, BF16")

    d = copy_fixture("qwen35_text", "dtype-f8")
    x = load_torch(os.path.join(d, ST))
    name = "model.layers.3.self_attn.o_proj.weight"
    x[name] = x[name].to(torch.float8_e4m3fn)
    save_torch(x, os.path.join(d, ST), metadata={"format": "pt"})
    both(d, f"'{name}' has dtype F8_E4M3 but config.json has no quantization_config", "supported without one: F32, F16, BF16")

    d = copy_fixture("qwen3_tiny", "dtype-f64-norm")  # a norm vector (read as float32) as well
    name = "model.layers.1.post_attention_layernorm.weight"
    resave(d, lambda x: x.__setitem__(name, x[name].astype(np.float64)))
    both(d, f"'{name}' has dtype F64")

    d = copy_fixture("qwen3_tiny", "dtype-f16")  # F16 is supported: loads and runs
    name = "model.layers.2.mlp.up_proj.weight"
    resave(d, lambda x: x.__setitem__(name, x[name].astype(np.float16)))
    expect_ok(["inspect", d, "--check-weights"], "F16 x1")
    expect_ok(["generate", "--target", d, *PROMPT])

    d = copy_fixture("dflash_qwen3", "dtype-drafter")
    resave(d, lambda x: x.__setitem__("fc.weight", x["fc.weight"].astype(np.int32)))
    both(fixture("qwen3_tiny"), "'fc.weight' has dtype I32", drafter=d)


def missing():
    d = copy_fixture("qwen35_text", "missing-alog")
    name = "model.layers.4.linear_attn.A_log"
    resave(d, lambda x: x.pop(name))
    both(d, d, f"missing tensor '{name}' (expected shape [4])")

    d = copy_fixture("qwen3_bf16", "missing-lm-head")
    x = load_torch(os.path.join(d, ST))
    del x["lm_head.weight"]
    save_torch(x, os.path.join(d, ST), metadata={"format": "pt"})
    both(d, "tie_word_embeddings is false", "missing tensor 'lm_head.weight' (expected shape [1024, 96])")

    d = copy_fixture("qwen3_tiny", "missing-embed")
    resave(d, lambda x: x.pop("model.embed_tokens.weight"))
    both(d, "no text embedding found", "embed_tokens.weight")

    d = copy_fixture("qwen3_tiny", "missing-file")
    os.remove(os.path.join(d, ST))
    both(d, d, "no model.safetensors")

    d = copy_fixture("dflash_qwen3", "missing-drafter-norm")
    resave(d, lambda x: x.pop("layers.0.self_attn.k_norm.weight"))
    both(fixture("qwen3_tiny"), "missing tensor 'layers.0.self_attn.k_norm.weight' (expected shape [32])",
         drafter=d)

    d = copy_fixture("dflash_qwen3", "missing-drafter-fc")
    resave(d, lambda x: x.pop("fc.weight"))
    both(fixture("qwen3_tiny"), "missing tensor 'fc.weight'", drafter=d)


def moe():
    """MoE checkpoints: a missing routed expert, a fused expert tensor of the wrong shape, a router
    that contradicts num_experts, a missing shared-expert gate, NaN in one expert."""
    d = copy_fixture("qwen3_moe", "moe-missing-expert")
    name = "model.layers.1.mlp.experts.5.up_proj.weight"
    resave(d, lambda x: x.pop(name))
    both(d, f"missing tensor '{name}' (expected shape [32, 64])", "expert 5 of num_experts 8",
         "no fused mlp.experts.gate_up_proj")

    d = copy_fixture("qwen35_moe_fused", "moe-fused-shape")
    name = "model.language_model.layers.2.mlp.experts.gate_up_proj"
    resave(d, lambda x: x.__setitem__(name, x[name][:, :40]))
    both(d, f"tensor '{name}' has shape [8, 40, 64], expected [8, 64, 64]",
         "num_experts 8, 2 x moe_intermediate_size 32 (gate | up), hidden_size 64")

    d = copy_fixture("qwen35_moe_vlm", "moe-router")
    edit_config(d, lambda c: c.update(num_experts=6), text_config=True)
    both(d, "tensor 'model.language_model.layers.0.mlp.gate.weight' has shape [8, 64], expected [6, 64]",
         "num_experts 6, hidden_size 64")

    d = copy_fixture("qwen35_moe_text", "moe-shared-gate")
    name = "model.layers.3.mlp.shared_expert_gate.weight"
    resave(d, lambda x: x.pop(name))
    both(d, f"missing tensor '{name}' (expected shape [1, 64])")

    d = copy_fixture("qwen3_moe", "moe-nan")
    name = "model.layers.3.mlp.experts.7.down_proj.weight"
    poke(os.path.join(d, ST), name, [5], [float("nan")])
    expect_fail(["inspect", d, "--check-weights"], f"'{name}': 1 non-finite value")


# --- drafters -----------------------------------------------------------------------------------

def drafters():
    tiny, hyb = fixture("qwen3_tiny"), fixture("qwen35_text")
    # hidden size of the drafter vs the target's
    expect_fail(["generate", "--target", tiny, "--drafter", fixture("dflash_qwen35"), *PROMPT],
                "does not fit", "hidden_size 128 != target hidden_size 64")
    expect_fail(["generate", "--target", hyb, "--drafter", fixture("dflash_qwen3"), *PROMPT],
                "hidden_size 64 != target hidden_size 128")
    p, _ = run(["inspect", fixture("dflash_qwen3"), "--target", hyb])
    t.check(p.returncode == 1 and "hidden_size 64 != target hidden_size 128" in p.stdout, f"inspect misfit: {p.stdout}")

    # the drafter's own config disagrees with its tensors
    d = copy_fixture("dflash_qwen3", "drafter-hidden")
    edit_config(d, lambda c: c.update(hidden_size=128))
    both(hyb, "'fc.weight' has shape [64, 128], expected [128, 256]", "hidden_size 128", drafter=d)

    # fc reads len(target_layer_ids) x hidden features
    d = copy_fixture("dflash_qwen3", "drafter-ids")
    edit_config(d, lambda c: c["dflash_config"].update(target_layer_ids=[0, 1, 2]))
    both(tiny, "'fc.weight' has shape [64, 128], expected [64, 192]", "3 target_layer_ids x hidden_size 64",
         drafter=d)

    d = copy_fixture("dflash_qwen3", "drafter-ids-range")
    edit_config(d, lambda c: c["dflash_config"].update(target_layer_ids=[0, 7]))
    expect_fail(["generate", "--target", tiny, "--drafter", d, *PROMPT],
                "target_layer_ids[1] = 7 but the target has layers 0..3")

    d = copy_fixture("dflash_qwen3", "drafter-vocab")
    edit_config(d, lambda c: c.update(vocab_size=2048))
    expect_fail(["generate", "--target", tiny, "--drafter", d, *PROMPT], "vocab_size 2048 != target vocab_size 1024")

    d = copy_fixture("dflash_qwen3", "drafter-cut")
    p = os.path.join(d, ST)
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 64)
    both(tiny, p, "beyond the data buffer", drafter=d)

    d = copy_fixture("dflash_qwen3", "drafter-q-proj")
    resave(d, lambda x: x.__setitem__("layers.0.self_attn.q_proj.weight",
                                      x["layers.0.self_attn.q_proj.weight"][:, :32].copy()))
    both(tiny, "'layers.0.self_attn.q_proj.weight' has shape [128, 32], expected [128, 64]", drafter=d)


t.run(good)
t.run(truncated, "qwen3_tiny")
t.run(truncated, "qwen35_text")
t.run(offsets)
t.run(shards)
t.run(nan_targets)
t.run(nan_drafter)
t.run(config_mismatch)
t.run(dtypes)
t.run(missing)
t.run(moe)
t.run(drafters)
shutil.rmtree(tmp, ignore_errors=True)
t.done()
