#!/usr/bin/env python3
"""Decode and prefill speed of transformers on torch CPU, shaped like `dfl bench` (bench/run
calls this; see bench/README.md).

    .venv/bin/python bench/hf_bench.py --model build/bench-model/target --threads 2 \\
        [--dtypes bf16,fp32] [--context 256] [--decode 16] [--prefill 512] [--reps 2]

For each dtype the model is loaded with `Qwen3_5ForCausalLM.from_pretrained(dtype=...)` (or
AutoModelForCausalLM for other targets), so bf16 runs bf16 matmuls on the BF16 weights and fp32
upcasts them once at load. Decode: `--context` random prompt tokens, then `--decode` greedy
single-token steps with the KV/recurrent cache (tokens/s over the steps). Prefill: one forward
over `--prefill` tokens with logits for the last position only (best of --reps). Prints one
JSON object: {"threads", "torch", "transformers", "bf16": {...}, "fp32": {...}}."""
import argparse
import json
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def ids(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g)


@torch.inference_mode()
def measure(model, a):
    vocab = model.config.vocab_size
    out = model(ids(a.context, vocab, 1), use_cache=True, logits_to_keep=1)
    cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    t0 = time.perf_counter()
    for _ in range(a.decode):
        out = model(tok, past_key_values=cache, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    decode_tps = a.decode / (time.perf_counter() - t0)
    prompt, best = ids(a.prefill, vocab, 4), float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        model(prompt, use_cache=True, logits_to_keep=1)
        best = min(best, time.perf_counter() - t0)
    return {"decode_tokens_per_s": decode_tps, "prefill_tokens_per_s": a.prefill / best}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    res = {"threads": a.threads, "torch": torch.__version__, "transformers": transformers.__version__,
           "context": a.context, "decode_tokens": a.decode, "prefill_tokens": a.prefill}
    for name in a.dtypes.split(","):
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=DTYPES[name])
        model.eval()
        res[name] = measure(model, a)
        del model
    print(json.dumps(res))


if __name__ == "__main__":
    main()
