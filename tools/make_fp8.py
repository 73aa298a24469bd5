"""Write a fine-grained FP8 checkpoint from an F32 / F16 / BF16 one, in the layout of the released
Qwen3 / Qwen3.5 "-FP8" checkpoints (docs/fp8.md):

    python tools/make_fp8.py SRC DST [--block 128,128] [--scale-dtype bf16|f32] [--quantize-mtp]
    python tools/make_fp8.py --dequantize FP8DIR DST    # the reference tests' float32 weights

Every linear weight of the text decoder layers (self_attn q/k/v/o_proj; linear_attn in_proj_qkv,
in_proj_z, out_proj; mlp gate/up/down_proj, per expert and shared expert too) becomes
float8_e4m3fn `<module>.weight` [out, in] with `<module>.weight_scale_inv` [ceil(out / bm),
ceil(in / bn)] beside it: per block, scale_inv = amax(|w|) / 448 (1 for an all-zero block) and
fp8 = round_to_nearest_even(w / scale_inv) clamped to +-448, so that w ~ fp8 * scale_inv.
Everything else keeps its dtype, as the released checkpoints keep it: embeddings, lm_head, norms,
the Gated DeltaNet's conv1d, A_log, dt_bias and its small in_proj_a / in_proj_b, the MoE router,
the vision tower and the mtp head (--quantize-mtp: its fc and layer projections too). config.json
gains the top-level quantization_config
{quant_method "fp8", fmt "e4m3", activation_scheme "dynamic", weight_block_size [bm, bn],
modules_to_not_convert: every module with a weight of 2 or more dims left unquantized}. Shards
keep their split (each scale in its weight's shard) and the index gains the scales; other files
are copied. Deterministic: the same input gives byte-identical output.

--dequantize writes the float32 checkpoint the reference tests run transformers on: every
(fp8, scale_inv) pair replaced by fp8 * scale_inv per block (transformers' Fp8Dequantize
arithmetic, with the last blocks of a row or column cut short), other tensors converted to
float32, quantization_config removed.
"""
import argparse
import json
import os
import re
import shutil

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FP8_MAX = 448.0  # largest finite float8_e4m3fn
TEXT_LAYERS = r"^(model\.|model\.language_model\.)layers\.\d+\."
PROJ = r"(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|mlp\.(experts\.\d+\.|shared_expert\.)?(gate|up|down)_proj)"
QUANTIZED = re.compile(TEXT_LAYERS + PROJ + r"\.weight$")
MTP = re.compile(r"^mtp\.(fc|layers\.\d+\." + PROJ + r")\.weight$")


def quantize(w, bm, bn, scale_dtype):
    """(fp8 [R, C], scale_inv [ceil(R/bm), ceil(C/bn)]) of a 2-D weight."""
    w = w.float()
    rows, cols = w.shape
    nr, nc = -(-rows // bm), -(-cols // bn)
    pad = torch.zeros(nr * bm, nc * bn)
    pad[:rows, :cols] = w
    blocks = pad.view(nr, bm, nc, bn)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).to(scale_dtype)
    q = (blocks / scale.float()[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(nr * bm, nc * bn)[:rows, :cols].contiguous(), scale


def dequantize(q, scale, bm, bn):
    """float32 weights of an (fp8, scale_inv) pair: each block times its scale."""
    rows, cols = q.shape
    s = scale.float().repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:rows, :cols]
    return q.float() * s


def convert(src, dst, block=(128, 128), scale_dtype=torch.bfloat16, quantize_mtp=False):
    bm, bn = block
    os.makedirs(dst, exist_ok=True)
    index_path = os.path.join(src, "model.safetensors.index.json")
    index = None
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        shards = sorted(set(index["weight_map"].values()))
    else:
        shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    kept, weight_map, total = set(), {}, 0
    for shard in shards:
        out = {}
        with safe_open(os.path.join(src, shard), "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if (QUANTIZED.match(name) or (quantize_mtp and MTP.match(name))) and t.ndim == 2:
                    q, s = quantize(t, bm, bn, scale_dtype)
                    out[name], out[name + "_scale_inv"] = q, s
                else:
                    out[name] = t
                    if name.endswith(".weight") and t.ndim >= 2:
                        kept.add(name[: -len(".weight")])
        save_file(out, os.path.join(dst, shard), metadata={"format": "pt"})
        for name, t in out.items():
            weight_map[name] = shard
            total += t.numel() * t.element_size()
    for name in sorted(os.listdir(src)):
        p = os.path.join(src, name)
        if os.path.isfile(p) and not name.endswith(".safetensors") and name not in ("config.json", "fixture.stamp"):
            shutil.copy(p, os.path.join(dst, name))
    if index is not None:
        index["weight_map"] = dict(sorted(weight_map.items()))
        index.setdefault("metadata", {})["total_size"] = total
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [bm, bn], "modules_to_not_convert": sorted(kept)}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def dequantize_dir(src, dst):
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    bm, bn = cfg.pop("quantization_config")["weight_block_size"]
    for name in sorted(os.listdir(src)):
        p = os.path.join(src, name)
        if name.endswith(".safetensors"):
            out = {}
            with safe_open(p, "pt") as f:
                keys = set(f.keys())
                for k in keys:
                    if k.endswith("_scale_inv"):
                        continue
                    t = f.get_tensor(k)
                    if k + "_scale_inv" in keys:
                        t = dequantize(t, f.get_tensor(k + "_scale_inv"), bm, bn)
                    out[k] = t.float().contiguous()
            save_file(dict(sorted(out.items())), os.path.join(dst, name), metadata={"format": "pt"})
        elif name == "model.safetensors.index.json":
            with open(p) as f:
                index = json.load(f)
            index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.endswith("_scale_inv")}
            with open(os.path.join(dst, name), "w") as f:
                json.dump(index, f, indent=2)
        elif os.path.isfile(p) and name not in ("config.json", "fixture.stamp"):
            shutil.copy(p, os.path.join(dst, name))
    cfg["dtype"] = "float32"
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dequantize", action="store_true", help="SRC is FP8: write its float32 dequantization")
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--block", default="128,128", help="weight_block_size rows,cols (default 128,128)")
    ap.add_argument("--scale-dtype", choices=("bf16", "f32"), default="bf16",
                    help="dtype of weight_scale_inv (Qwen3.5 FP8 releases: bf16)")
    ap.add_argument("--quantize-mtp", action="store_true", help="also the mtp head's fc and layer projections")
    a = ap.parse_args()
    if a.dequantize:
        return dequantize_dir(a.src, a.dst)
    block = tuple(int(x) for x in a.block.split(","))
    if len(block) != 2 or min(block) < 1:
        ap.error(f"--block: expected two positive integers, found {a.block!r}")
    convert(a.src, a.dst, block, torch.bfloat16 if a.scale_dtype == "bf16" else torch.float32, a.quantize_mtp)


if __name__ == "__main__":
    main()
