"""A PyTorch pipeline's hidden states for the sequences of a `dfl eval --save-features` directory,
in the `dfl hidden` layout (input_ids I64 [T], layer.{k} F32 [T, H] = output of decoder layer k),
one file per saved truth under the same name, for `dfl eval --features DIR --features-from OUT`.

    python tools/pipeline_features.py FEATURES_DIR OUT_DIR [--target DIR] [--dtype float32|bfloat16]

The target is run by Hugging Face transformers (its own kernels, the given dtype) on each file's
input_ids; each requested layer's output is taken with a forward hook on that decoder layer
(transformers' hidden_states[k+1], except that the last entry of hidden_states is after the final
norm: a hook has no such exception). This is what a training pipeline would feed its drafter."""
import argparse
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def decoder_layers(model):
    for path in ("model.layers", "model.language_model.layers", "language_model.model.layers"):
        m = model
        try:
            for p in path.split("."):
                m = getattr(m, p)
            return m
        except AttributeError:
            continue
    raise SystemExit("cannot find the decoder layers of this model")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("features")
    ap.add_argument("out")
    ap.add_argument("--target", help="target checkpoint (default: the one recorded in target.json)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.features, "target.json")))
    target = a.target or meta["target"]
    layers = meta["layers"]
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, attn_implementation="eager").eval()
    dec = decoder_layers(model)
    got = {}
    for k in layers:
        dec[k].register_forward_hook(lambda m, i, o, k=k: got.__setitem__(k, (o[0] if isinstance(o, tuple) else o)))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.features, "manifest.jsonl")) as f:
        files = [json.loads(x)["file"] for x in f if x.strip()]
    for name in files:
        with safe_open(os.path.join(a.features, name), "pt") as f:
            ids = f.get_tensor("input_ids")
        with torch.no_grad():
            model(ids[None].to(torch.long))
        d = {"input_ids": ids.to(torch.int64)}
        for k in layers:
            d[f"layer.{k}"] = got[k][0].float().contiguous()
        save_file(d, os.path.join(a.out, name))
    print(f"[pipeline_features] {len(files)} files, layers {layers}, {a.dtype} -> {a.out}")


if __name__ == "__main__":
    main()
