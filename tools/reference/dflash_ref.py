"""Reference DFlash speculative decoding with z-lab's `dflash` package (CPU, float32, greedy).

    python tools/reference/dflash_ref.py --mode generate --target T --drafter D
        (--ids 1,2,3 | --prompt-ids-file F | --prompt TEXT) --max-new N [--block-size B] [--stop ID,..]
      prints {"output_ids": [generated ids only], "acceptance_lengths": [...], ...} (one JSON line).
      acceptance_lengths are dflash's: tokens committed per round (accepted drafts + bonus).

    python tools/reference/dflash_ref.py --mode block --target T --drafter D --ids ... --out F.safetensors
        [--rounds R] [--block-size B] [--max-new N]
      runs dflash_generate itself (no stop tokens, max_new_tokens = R*B + 1 unless given, so the
      first R rounds all verify full blocks) and records, through hooks, what each round did:
        input_ids I64 [T]; target_layer_ids I64 [k]; output_ids I64 [n] (all generated ids);
        acceptance_lengths I64 [rounds];
        per round r < R:
          draft_logits.{r}     F32 [B-1, V]  drafter logits for block positions 1..B-1
          block_ids.{r}        I64 [B]       [anchor, argmax drafts] = what the target verified
          start.{r}            I64 [1]       position of the anchor
          context_len.{r}      I64 [1]       new context rows fed this round (round 0: T)
          context_features.{r} F32 [ctx, k*H] target layer outputs at target_layer_ids
          accepted.{r}         I64 [1]       accepted drafts a (committed this round = a + 1)
          committed.{r}        I64 [start+a+1] prompt + everything committed through round r
          next_anchor.{r}      I64 [1]       bonus token = next round's anchor
        and round 0 again as draft_logits, anchor, context_len (the single-block contract).

Rollback of hybrid (Qwen3.5) targets: with transformers 5.15, DynamicCache.crop() on a
linear-attention layer trims the conv window back to the accepted prefix but leaves the recurrent
state S at the END of the verified block, so plain dflash_generate is NOT lossless on Qwen3.5
targets (its output drifts from greedy decoding after the first block with a rejected draft).
--rollback exact (default) fixes that without touching the package: before each verify forward
the target cache is snapshotted; when dflash crops it, the snapshot is restored and the accepted
tokens are replayed. For attention-only targets (Qwen3) both settings give identical results.
--rollback dflash runs the package exactly as released.
"""
import argparse
import copy
import json
import os
import re
import sys
import time

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.cache_utils import LinearAttentionCacheLayerMixin
from transformers.utils import logging as hf_logging

import dflash.model as dm
from dflash.model import DFlashDraftModel, dflash_generate

dm._cuda_time = time.perf_counter  # return_stats times with torch.cuda.synchronize(); none on CPU


class ExactRollback:
    """Make dflash's target-cache crop exact for linear-attention layers (see module doc)."""

    def __init__(self, target):
        self.target, self.snap, self.busy = target, None, False
        self.orig_crop = dm._crop_to
        self.hook = target.register_forward_pre_hook(self.before_forward, with_kwargs=True)
        dm._crop_to = self.crop

    def close(self):
        dm._crop_to = self.orig_crop
        self.hook.remove()

    def before_forward(self, _module, args, kwargs):
        cache = kwargs.get("past_key_values")
        if self.busy or cache is None or not any(isinstance(l, LinearAttentionCacheLayerMixin) for l in cache.layers):
            return  # attention-only caches crop exactly
        n = cache.get_seq_length()
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.snap = (cache, copy.deepcopy(cache.layers), n, ids, kwargs.get("position_ids")) if n else None

    def crop(self, cache, length):
        if self.snap is not None and cache is self.snap[0] and length < cache.get_seq_length():
            _, layers, n0, ids, pos = self.snap
            cache.layers = layers
            keep = length - n0
            self.busy = True
            with torch.inference_mode():
                self.target(ids[:, :keep], position_ids=pos[:, :keep], past_key_values=cache, use_cache=True)
            self.busy = False
            self.snap = None
        self.orig_crop(cache, length)


def parse_ids(s):
    s = s.strip()
    return [int(x) for x in (json.loads(s) if s.startswith("[") else re.split(r"[,\s]+", s)) if x != ""]


def read_ids(args):
    if args.ids:
        return parse_ids(args.ids)
    if args.prompt_ids_file:
        with open(args.prompt_ids_file) as f:
            return parse_ids(f.read())
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(args.target, "tokenizer.json")).encode(args.prompt).ids


def load(args):
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    drafter = DFlashDraftModel.from_pretrained(args.drafter, dtype=torch.float32).eval()
    return target, drafter


def run_generate(args, target, drafter, input_ids, rollback):
    stop = parse_ids(args.stop) if args.stop else None
    res = dflash_generate(drafter, target, input_ids, args.max_new, stop, block_size=args.block_size,
                          return_stats=True)
    out = res.output_ids[0, input_ids.shape[1]:].tolist()
    L = res.acceptance_lengths
    print(json.dumps({"output_ids": out, "acceptance_lengths": L, "rounds": len(L),
                      "tau": len(out) / max(1, len(L)), "block_size": args.block_size or drafter.block_size,
                      "target_layer_ids": list(drafter.target_layer_ids), "mask_token_id": drafter.mask_token_id}))


def run_block(args, target, drafter, input_ids, rollback):
    B = args.block_size or drafter.block_size
    R = args.rounds
    max_new = args.max_new or R * B + 1
    drafts, logits, verifies = [], [], []

    def on_drafter(_m, _args, kwargs, _out):
        drafts.append({"features": kwargs["target_hidden"][0].float().clone(),
                       "positions": kwargs["position_ids"][0].clone()})

    real_compute_logits = drafter.compute_logits

    def compute_logits(hidden, head):
        out = real_compute_logits(hidden, head)
        logits.append(out[0].float().clone())
        return out

    def on_target(_m, args_, kwargs, _out):
        if rollback is not None and rollback.busy:
            return  # a replay of accepted tokens, not a dflash call
        ids = kwargs.get("input_ids", args_[0] if args_ else None)
        verifies.append(ids[0].clone())

    drafter.compute_logits = compute_logits
    h1 = drafter.register_forward_hook(on_drafter, with_kwargs=True)
    h2 = target.register_forward_hook(on_target, with_kwargs=True)
    res = dflash_generate(drafter, target, input_ids, max_new, None, block_size=B, return_stats=True)
    h1.remove()
    h2.remove()

    T = input_ids.shape[1]
    full = res.output_ids[0]
    acc = res.acceptance_lengths
    verifies = verifies[1:]  # call 0 is the prefill
    if len(acc) < R:
        sys.exit(f"only {len(acc)} rounds ran; raise --max-new")
    t = {"input_ids": input_ids[0].clone(), "output_ids": full[T:].clone(),
         "acceptance_lengths": torch.tensor(acc, dtype=torch.long),
         "target_layer_ids": torch.tensor(list(drafter.target_layer_ids), dtype=torch.long)}
    start = T
    for r in range(R):
        ctx = drafts[r]["features"].shape[0]
        assert int(drafts[r]["positions"][ctx]) == start and len(verifies[r]) == B
        a = acc[r] - 1
        assert torch.equal(full[start:start + a + 1], verifies[r][:a + 1])
        t[f"draft_logits.{r}"] = logits[r].contiguous()
        t[f"block_ids.{r}"] = verifies[r]
        t[f"start.{r}"] = torch.tensor([start])
        t[f"context_len.{r}"] = torch.tensor([ctx])
        t[f"context_features.{r}"] = drafts[r]["features"].contiguous()
        t[f"accepted.{r}"] = torch.tensor([a])
        t[f"committed.{r}"] = full[:start + a + 1].clone()
        t[f"next_anchor.{r}"] = full[start + a + 1:start + a + 2].clone()
        start += a + 1
    t["draft_logits"] = t["draft_logits.0"].clone()
    t["anchor"] = t["block_ids.0"][:1].clone()
    t["context_len"] = t["context_len.0"].clone()
    save_file(t, args.out, metadata={"target": os.path.abspath(args.target),
                                     "drafter": os.path.abspath(args.drafter), "block_size": str(B)})
    print(json.dumps({"out": args.out, "rounds": R, "block_size": B, "anchor": int(t["anchor"][0]),
                      "accepted": [int(t[f"accepted.{r}"][0]) for r in range(R)],
                      "target_layer_ids": list(drafter.target_layer_ids)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["generate", "block"], required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids")
    src.add_argument("--prompt-ids-file")
    src.add_argument("--prompt", help="text, encoded with TARGET/tokenizer.json")
    ap.add_argument("--max-new", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--stop", help="stop token ids (generate mode); default: none")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--rollback", choices=["exact", "dflash"], default="exact",
                    help="exact: correct linear-attention rollback (default); dflash: the package as is")
    args = ap.parse_args()
    if args.mode == "generate" and args.max_new <= 0:
        ap.error("--mode generate needs --max-new N")
    if args.mode == "block" and not args.out:
        ap.error("--mode block needs --out")
    torch.set_num_threads(min(4, torch.get_num_threads()))
    hf_logging.disable_progress_bar()
    target, drafter = load(args)
    input_ids = torch.tensor([read_ids(args)], dtype=torch.long)
    rollback = ExactRollback(target) if args.rollback == "exact" else None
    (run_generate if args.mode == "generate" else run_block)(args, target, drafter, input_ids, rollback)


if __name__ == "__main__":
    main()
