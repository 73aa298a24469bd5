#!/usr/bin/env python3
"""Decode and prefill speed of transformers on torch CPU, shaped like `dfl bench` (bench/run
calls this; see bench/README.md), or on a CUDA GPU (--device cuda).

    .venv/bin/python bench/hf_bench.py --model build/bench-model/target --threads 2 \\
        [--dtypes bf16,fp32] [--context 256] [--decode 16] [--prefill 512] [--reps 2] [--verify N]
    python3 bench/hf_bench.py --device cuda --model /dev/shm/qwen3.6-27b [--verify 16]

For each dtype the model is loaded with `Qwen3_5ForCausalLM.from_pretrained(dtype=...)` (or
AutoModelForCausalLM for other targets), so bf16 runs bf16 matmuls on the BF16 weights and fp32
upcasts them once at load. Decode: `--context` random prompt tokens, then `--decode` greedy
single-token steps with the KV/recurrent cache (tokens/s over the steps). Prefill: one forward
over `--prefill` tokens with logits for the last position only (best of --reps). Verify (--verify
N, default 0 on cpu, 16 on cuda): one forward over N new tokens on top of the `--context`-token
cache with logits for every row, what a speculative verification of an N-token block costs (best
of --reps; each rep on a freshly prefilled cache, since the recurrent state cannot be rolled back).
Prints one JSON object: {"threads", "torch", "transformers", "bf16": {...}, "fp32": {...}}; with
--verify also "verify_tokens" and per dtype "verify_ms", "verify_vs_decode" (verify_ms over the
mean decode ms/token) and "decode_ms_per_token".

--device cuda (default dtypes bf16; --threads optional): the model is loaded onto the GPU
(device_map="cuda" when accelerate is installed, else loaded on the CPU and moved), one untimed
warm-up pass runs first, every timed region is bracketed by torch.cuda.synchronize(), and decode
is timed token by token (decode_ms_per_token: the median; _mean too; decode_tokens_per_s from
the mean). The JSON adds "device": "cuda", "gpu" (the device name), "cuda" (torch's CUDA
version), "linear_attention_kernels" (whether the fla / causal_conv1d packages that
transformers' Gated DeltaNet uses are installed; without them it runs its torch fallbacks), and
per dtype "load_s", "peak_gpu_gb" and "attn_implementation".
"""
import argparse
import importlib.util
import json
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def ids(n, vocab, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g).to(device)


def no_sync():
    pass


@torch.inference_mode()
def warmup(model, a, device):
    """Untimed: CUDA context, cuBLAS handles and the kernels of every shape the timing runs."""
    vocab = model.config.vocab_size
    out = model(ids(a.context, vocab, 7, device), use_cache=True, logits_to_keep=1)
    cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    for _ in range(2):
        out = model(tok, past_key_values=cache, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    if a.verify:
        model(ids(a.verify, vocab, 8, device), past_key_values=cache, use_cache=True)
    model(ids(a.prefill, vocab, 9, device), use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()


@torch.inference_mode()
def measure(model, a, device="cpu"):
    cuda = device != "cpu"
    sync = torch.cuda.synchronize if cuda else no_sync
    vocab = model.config.vocab_size
    out = model(ids(a.context, vocab, 1, device), use_cache=True, logits_to_keep=1)
    cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
    steps = []
    sync()
    t0 = time.perf_counter()
    for _ in range(a.decode):
        ts = time.perf_counter()
        out = model(tok, past_key_values=cache, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync()
        steps.append(time.perf_counter() - ts)
    total = time.perf_counter() - t0
    decode_tps = a.decode / total
    del out, cache, tok
    prompt, best = ids(a.prefill, vocab, 4, device), float("inf")
    for _ in range(a.reps):
        sync()
        t0 = time.perf_counter()
        model(prompt, use_cache=True, logits_to_keep=1)
        sync()
        best = min(best, time.perf_counter() - t0)
    res = {"decode_tokens_per_s": decode_tps, "prefill_tokens_per_s": a.prefill / best}
    if cuda or a.verify:
        res["decode_ms_per_token"] = 1e3 * (statistics.median(steps) if cuda else total / a.decode)
    if cuda:
        res["decode_ms_per_token_mean"] = 1e3 * total / a.decode
    if a.verify:
        context, block, vbest = ids(a.context, vocab, 1, device), ids(a.verify, vocab, 5, device), float("inf")
        for _ in range(a.reps):
            cache = model(context, use_cache=True, logits_to_keep=1).past_key_values
            sync()
            t0 = time.perf_counter()
            model(block, past_key_values=cache, use_cache=True)  # logits for all rows, as verification needs
            sync()
            vbest = min(vbest, time.perf_counter() - t0)
            del cache
        res["verify_ms"] = 1e3 * vbest
        res["verify_vs_decode"] = res["verify_ms"] / (1e3 * total / a.decode)
    return res


def load(a, dtype, device):
    if device == "cpu":
        return AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    if importlib.util.find_spec("accelerate"):
        return AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, device_map=device)
    return AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--threads", type=int, help="torch CPU threads (required on cpu)")
    ap.add_argument("--dtypes", help="default bf16,fp32 on cpu, bf16 on cuda")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--verify", type=int, help="tokens of the verification forward (default 0 on cpu: off, "
                    "16 on cuda)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    if not cuda and a.threads is None:
        ap.error("--threads is required on cpu")
    if cuda and not torch.cuda.is_available():
        ap.error(f"--device cuda: torch {torch.__version__} sees no CUDA device")
    if a.dtypes is None:
        a.dtypes = "bf16" if cuda else "bf16,fp32"
    if a.verify is None:
        a.verify = 16 if cuda else 0
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    res = {"threads": a.threads if a.threads is not None else torch.get_num_threads(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    device = "cpu"
    if cuda:
        device = "cuda"
        res.update({"device": "cuda", "gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                    "linear_attention_kernels": {p: importlib.util.find_spec(p) is not None
                                                 for p in ("fla", "causal_conv1d")}})
    res.update({"context": a.context, "decode_tokens": a.decode, "prefill_tokens": a.prefill})
    if a.verify:
        res["verify_tokens"] = a.verify
    for name in a.dtypes.split(","):
        t0 = time.perf_counter()
        model = load(a, DTYPES[name], device)
        model.eval()
        if cuda:
            torch.cuda.synchronize()
            load_s = time.perf_counter() - t0
            torch.cuda.reset_peak_memory_stats()
            warmup(model, a, device)
        res[name] = measure(model, a, device)
        if cuda:
            res[name].update({"load_s": load_s, "peak_gpu_gb": torch.cuda.max_memory_allocated() / 1e9,
                              "attn_implementation": getattr(model.config, "_attn_implementation", None)})
        del model
        if cuda:
            torch.cuda.empty_cache()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
