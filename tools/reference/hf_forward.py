"""Reference forward pass of a target model with transformers (CPU, eager attention).

    python tools/reference/hf_forward.py --model DIR (--ids 1,2,3 | --prompt-ids-file F |
        --random-len T --seed S | --prompt TEXT) --out REF.safetensors [--greedy N] [--dtype float32]

Writes (the format of `dfl hidden` output, plus extras):
  input_ids   I64 [T]
  logits      F32 [T, V]
  layer.{k}   F32 [T, H]  output of decoder layer k (residual stream after its MLP), k = 0..L-1
  final_norm  F32 [T, H]  after the final norm (= transformers' last hidden_states entry)
  greedy      I64 [N]     with --greedy N: N argmax tokens after the prompt (KV-cached decode,
                          EOS is not special: if it is the argmax it is emitted and decoding goes on)
  greedy_margin F32 [N]   top-1 minus top-2 logit at each greedy step (small = fragile token)

Layer outputs: transformers' hidden_states[k+1] is decoder layer k's output EXCEPT the last
entry, which it replaces with the final-norm output. So layer.{k} is captured with forward hooks
on every decoder layer (model.model.layers for Qwen3ForCausalLM / Qwen3_5ForCausalLM,
model.model.language_model.layers for a VLM class); the script checks that hooks and
hidden_states[1..L-1] agree. Prints a one-line JSON summary.
"""
import argparse
import json
import os
import re

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

LAYER_PATHS = ("model.layers", "model.language_model.layers")


def decoder_layers(model):
    for path in LAYER_PATHS:
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return path, obj
    raise SystemExit(f"no decoder layers at any of {LAYER_PATHS} in {type(model).__name__}")


def read_ids(args, model):
    if args.ids:
        return [int(x) for x in re.split(r"[,\s]+", args.ids.strip()) if x]
    if args.prompt_ids_file:
        with open(args.prompt_ids_file) as f:
            text = f.read().strip()
        return [int(x) for x in (json.loads(text) if text.startswith("[") else re.split(r"[,\s]+", text)) if x != ""]
    if args.prompt is not None:
        from tokenizers import Tokenizer
        return Tokenizer.from_file(os.path.join(args.model, "tokenizer.json")).encode(args.prompt).ids
    hi = model.config.get_text_config().vocab_size
    tok_path = os.path.join(args.model, "tokenizer.json")
    if os.path.exists(tok_path):  # stay inside the learned vocabulary (no special tokens)
        with open(tok_path) as f:
            hi = min(hi, len(json.load(f)["model"]["vocab"]))
    g = torch.Generator().manual_seed(args.seed)
    return torch.randint(0, hi, (args.random_len,), generator=g).tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="comma-separated token ids")
    src.add_argument("--prompt-ids-file", help="file with ids (JSON list or comma/space separated)")
    src.add_argument("--random-len", type=int, help="T random ids from the tokenizer's learned vocab")
    src.add_argument("--prompt", help="text, encoded with DIR/tokenizer.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--greedy", type=int, default=0, metavar="N")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args()
    torch.set_num_threads(min(4, torch.get_num_threads()))
    hf_logging.disable_progress_bar()

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="eager").eval()
    path, layers = decoder_layers(model)
    ids = read_ids(args, model)
    input_ids = torch.tensor([ids], dtype=torch.long)

    captured = {}

    def hook(k):
        def fn(_module, _args, output):
            captured[k] = (output[0] if isinstance(output, tuple) else output).detach()
        return fn

    handles = [layer.register_forward_hook(hook(k)) for k, layer in enumerate(layers)]
    with torch.no_grad():
        out = model(input_ids, output_hidden_states=True, use_cache=False)
    for h in handles:
        h.remove()

    L = len(layers)
    hs = out.hidden_states
    assert len(hs) == L + 1 and len(captured) == L, (len(hs), len(captured), L)
    for k in range(L - 1):
        assert torch.equal(hs[k + 1], captured[k]), f"hook and hidden_states disagree at layer {k}"
    tensors = {"input_ids": input_ids[0].clone(), "logits": out.logits[0].float().contiguous(),
               "final_norm": hs[-1][0].float().contiguous()}
    for k in range(L):
        tensors[f"layer.{k}"] = captured[k][0].float().contiguous()

    greedy, margins = [], []
    if args.greedy > 0:
        with torch.no_grad():
            step = model(input_ids, use_cache=True)
            for _ in range(args.greedy):
                logits = step.logits[0, -1].float()
                top = torch.topk(logits, 2).values
                nxt = int(torch.argmax(logits))
                greedy.append(nxt)
                margins.append(float(top[0] - top[1]))
                step = model(torch.tensor([[nxt]]), past_key_values=step.past_key_values, use_cache=True)
        tensors["greedy"] = torch.tensor(greedy, dtype=torch.long)
        tensors["greedy_margin"] = torch.tensor(margins, dtype=torch.float32)

    save_file(tensors, args.out, metadata={"model": os.path.abspath(args.model), "class": type(model).__name__,
                                           "layers": path, "dtype": args.dtype})
    V = tensors["logits"].shape[-1]
    print(json.dumps({"model": args.model, "class": type(model).__name__, "layers": path, "T": len(ids),
                      "L": L, "H": tensors["final_norm"].shape[-1], "V": V, "dtype": args.dtype,
                      "greedy": greedy, "min_margin": min(margins) if margins else None, "out": args.out}))


if __name__ == "__main__":
    main()
