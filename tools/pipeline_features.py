"""A PyTorch pipeline's hidden states for the sequences of a `dfl eval --save-features` directory,
in the `dfl hidden` layout (input_ids I64 [T], layer.{k} [T, H] = output of decoder layer k),
one file per saved truth under the same name, for `dfl eval --features DIR --features-from OUT`.

    python tools/pipeline_features.py FEATURES_DIR OUT_DIR [--target DIR] [--dtype float32|bfloat16]
                                      [--mistake off-by-one|post-norm|bf16]

The target is run by Hugging Face transformers (its own kernels, the given dtype) on each file's
input_ids; each requested layer's output is taken with a forward hook on that decoder layer
(transformers' hidden_states[k+1], except that the last entry of hidden_states is after the final
norm: a hook has no such exception). This is what a training pipeline would feed its drafter.

--mistake reproduces a pipeline bug, to see what it does to acceptance (tests/py/test_seed_failures.py):
  off-by-one  layer k taken as transformers' hidden_states[k]: the output of layer k - 1, one layer
              early (hidden_states[0], the embeddings, for k = 0) — forgetting that entry 0 is the
              embedding output;
  post-norm   every layer taken as hidden_states[k + 1], the right index, but transformers' last
              entry (k = the target's last layer) is after the final norm, not the layer's output:
              only a captured last layer is wrong (the features a drafter reading the last layer
              would get from `output_hidden_states=True`, the classic EAGLE-3/DFlash pipeline slip);
              the other layers are exact, and the tool says which layer it changed;
  bf16        the target run in bfloat16 and the features stored as BF16 tensors (a pipeline that
              keeps its activations in half precision), whatever --dtype says."""
import argparse
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

MISTAKES = ("off-by-one", "post-norm", "bf16")


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


def load(target, dtype):
    return AutoModelForCausalLM.from_pretrained(target, dtype=dtype, attn_implementation="eager").eval()


@torch.no_grad()
def layer_features(model, ids, layers, mistake=None):
    """{k: [T, H]} for one sequence (ids: I64 [T]), as the pipeline (with its mistake) computes them."""
    if mistake in ("off-by-one", "post-norm"):
        hs = model(ids[None].to(torch.long), output_hidden_states=True).hidden_states
        n = len(decoder_layers(model))
        assert len(hs) == n + 1, f"{len(hs)} hidden states for {n} layers"
        return {k: hs[k if mistake == "off-by-one" else k + 1][0] for k in layers}
    dec = decoder_layers(model)
    got = {}
    hooks = [dec[k].register_forward_hook(lambda m, i, o, k=k: got.__setitem__(k, o[0] if isinstance(o, tuple) else o))
             for k in layers]
    try:
        model(ids[None].to(torch.long))
    finally:
        for h in hooks:
            h.remove()
    return {k: got[k][0] for k in layers}


def write_dir(model, features, out, layers, mistake=None):
    """One file per saved truth of `features` into `out`; returns the file names."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(features, "manifest.jsonl")) as f:
        files = [json.loads(x)["file"] for x in f if x.strip()]
    store = torch.bfloat16 if mistake == "bf16" else torch.float32
    for name in files:
        with safe_open(os.path.join(features, name), "pt") as f:
            ids = f.get_tensor("input_ids")
        got = layer_features(model, ids, layers, mistake)
        d = {"input_ids": ids.to(torch.int64)}
        for k in layers:
            d[f"layer.{k}"] = got[k].to(store).contiguous()
        save_file(d, os.path.join(out, name))
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("features")
    ap.add_argument("out")
    ap.add_argument("--target", help="target checkpoint (default: the one recorded in target.json)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--mistake", choices=MISTAKES, help="reproduce a pipeline bug (see the module docstring)")
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.features, "target.json")))
    target = a.target or meta["target"]
    layers = meta["layers"]
    dtype = torch.bfloat16 if a.mistake == "bf16" else getattr(torch, a.dtype)
    model = load(target, dtype)
    files = write_dir(model, a.features, a.out, layers, a.mistake)
    note = ""
    if a.mistake == "off-by-one":
        note = f", layer k = output of layer k-1 for k in {layers}"
    elif a.mistake == "post-norm":
        last = len(decoder_layers(model)) - 1
        note = (f", layer {last} after the final norm" if last in layers else
                f", no change: the target's last layer {last} is not among the captured ones")
    elif a.mistake == "bf16":
        note = ", run and stored in bfloat16"
    print(f"[pipeline_features] {len(files)} files, layers {layers}, {str(dtype).replace('torch.', '')}"
          f"{' mistake ' + a.mistake + note if a.mistake else ''} -> {a.out}")


if __name__ == "__main__":
    main()
