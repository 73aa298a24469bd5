"""Stage 2: train the embedded Qwen3.5-hybrid target on GSM8K train (ChatML), save it as released
Qwen3.5 checkpoints are laid out (VLM: model.language_model.*, a tiny model.visual.* tower, mtp.*), BF16.

    python tools/train/train_target.py --tokenizer build/train/tokenizer --out models/target

Architecture (Qwen3_5ForCausalLM during training): H 128, 8 layers (linear:full = 3:1), gated
full attention 4/2 heads x 64 with partial RoPE 0.25, Gated DeltaNet 2 key / 4 value heads x 32,
MLP 512, tied embeddings, vocab 4096 (2.7M parameters: sized for 2 shared CPU cores). Data: every train example as
`<|im_start|>user\\n{q}<|im_end|>\\n<|im_start|>assistant\\n{a}<|im_end|>`; the loss covers the
assistant part only (answer tokens and the closing <|im_end|>). Seeded; bf16 autocast on CPU for the
matmuls (weights and optimizer in fp32); the Gated DeltaNet chunk rule is swapped for an equal but
faster form (fast_gdn.py) during training only.
"""
import argparse
import json
import math
import os
import random
import shutil
import time

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import GenerationConfig
from transformers.models.qwen3_5 import (Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
                                         Qwen3_5TextConfig)
from transformers.utils import logging as hf_logging

import common
import fast_gdn
import make_fixtures  # tools/make_fixtures.py: add_mtp, TINY_VISION

VOCAB = 4096
TEXT = dict(hidden_size=128, num_hidden_layers=8, intermediate_size=512,
            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2, full_attention_interval=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
            linear_conv_kernel_dim=4, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [3, 3, 2], "mrope_interleaved": True},
            attn_output_gate=True, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
            vocab_size=VOCAB)


def specials(tokdir):
    with open(os.path.join(tokdir, "tokenizer.json")) as f:
        return {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}


def text_config(sp):
    return dict(TEXT, bos_token_id=sp["<|endoftext|>"], eos_token_id=sp["<|im_end|>"], pad_token_id=sp["<|endoftext|>"])


def encode_examples(tok, rows, sp):
    data = []
    for ex in rows:
        p = tok.encode(common.chat_prompt(ex["question"])).ids
        a = tok.encode(ex["answer"]).ids + [sp["<|im_end|>"]]
        data.append((p + a, len(p)))
    return data


def batches(data, max_tokens, rng):
    """Length-sorted buckets of at most max_tokens padded tokens, in random order."""
    order = sorted(range(len(data)), key=lambda i: (len(data[i][0]), rng.random()))
    out, cur, cur_max = [], [], 0
    for i in order:
        n = len(data[i][0])
        if cur and max(cur_max, n) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(data, idx, pad):
    T = max(len(data[i][0]) for i in idx)
    ids = torch.full((len(idx), T), pad, dtype=torch.long)
    labels = torch.full((len(idx), T), -100, dtype=torch.long)
    for r, i in enumerate(idx):
        seq, plen = data[i]
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, plen:len(seq)] = torch.tensor(seq[plen:])  # right padding: pads never reach real tokens
    return ids, labels


def save_vlm(text_model, sp, tokdir, out):
    """The trained text model as a released-layout Qwen3.5 VLM checkpoint in BF16."""
    tc = text_config(sp)
    cfg = Qwen3_5Config(text_config=tc, vision_config=dict(make_fixtures.TINY_VISION, out_hidden_size=tc["hidden_size"]),
                        tie_word_embeddings=True, vision_start_token_id=VOCAB - 4, vision_end_token_id=VOCAB - 3,
                        image_token_id=VOCAB - 2, video_token_id=VOCAB - 1)
    torch.manual_seed(0)
    vlm = Qwen3_5ForConditionalGeneration(cfg)
    missing, unexpected = vlm.model.language_model.load_state_dict(text_model.model.state_dict(), strict=True)
    assert not missing and not unexpected
    vlm.generation_config = GenerationConfig(bos_token_id=sp["<|endoftext|>"], pad_token_id=sp["<|endoftext|>"],
                                             eos_token_id=[sp["<|im_end|>"], sp["<|endoftext|>"]], do_sample=False)
    vlm.to(torch.bfloat16)
    shutil.rmtree(out, ignore_errors=True)
    vlm.save_pretrained(out)
    make_fixtures.add_mtp(out, vlm, 11, torch.bfloat16)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokdir, f), os.path.join(out, f))
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)
    n_text = sum(v.numel() for k, v in load_file(os.path.join(out, "model.safetensors")).items()
                 if k.startswith("model.language_model."))
    return n_text


@torch.no_grad()
def sample_answers(model, tok, sp, rows, max_new=160):
    model.eval()
    outs = []
    for ex in rows:
        ids = torch.tensor([tok.encode(common.chat_prompt(ex["question"])).ids])
        g = model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=sp["<|im_end|>"],
                           pad_token_id=sp["<|endoftext|>"])
        outs.append(tok.decode(g[0, ids.shape[1]:].tolist(), skip_special_tokens=True))
    model.train()
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=os.path.join(common.WORK, "target"))
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: 2 shared cores, oversubscribed)")
    ap.add_argument("--no-autocast", action="store_true")
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    fast_gdn.patch()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.work, exist_ok=True)
    t_start = time.time()

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    sp = specials(args.tokenizer)
    data = encode_examples(tok, common.read_jsonl(common.GSM8K_TRAIN), sp)
    cfg = Qwen3_5TextConfig(**text_config(sp))
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    common.log(f"{len(data)} examples, {sum(len(s) for s, _ in data)} tokens, "
               f"{sum(len(s) - p for s, p in data)} loss tokens; model {n_params / 1e6:.2f}M params")

    rng = random.Random(args.seed)
    per_epoch = len(batches(data, args.batch_tokens, random.Random(0)))
    total = int(per_epoch * args.epochs)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in n or n.endswith(("A_log", "dt_bias")) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - args.warmup) / max(1, total - args.warmup))))

    curve, step, ema = [], 0, None
    model.train()
    while step < total:
        for idx in batches(data, args.batch_tokens, rng):
            if step >= total:
                break
            ids, labels = collate(data, idx, sp["<|endoftext|>"])
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast):
                logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                                     labels[:, 1:].reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
            if step % args.log_every == 0 or step == total:
                el = time.time() - t_start
                curve.append({"step": step, "epoch": round(step / per_epoch, 3), "loss": round(loss.item(), 4),
                              "loss_ema": round(ema, 4), "lr": lr_at(step - 1), "elapsed_s": round(el, 1)})
                common.log(f"step {step}/{total} ep {step / per_epoch:.2f} loss {loss.item():.4f} ema {ema:.4f} "
                           f"gnorm {gn:.2f} lr {lr_at(step - 1):.2e} {el:.0f}s")
            if step % per_epoch == 0:
                torch.save(model.state_dict(), os.path.join(args.work, "text_model.pt"))
    train_s = time.time() - t_start
    torch.save(model.state_dict(), os.path.join(args.work, "text_model.pt"))

    # held-out loss on the first 200 test examples (assistant tokens), fp32
    model.eval()
    test = encode_examples(tok, common.read_jsonl(common.GSM8K_TEST, 200), sp)
    with torch.no_grad():
        tot, cnt = 0.0, 0
        for i in range(0, len(test), 16):
            ids, labels = collate(test, list(range(i, min(i + 16, len(test)))), sp["<|endoftext|>"])
            lg = model(input_ids=ids).logits
            l = torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), labels[:, 1:].reshape(-1),
                                                  ignore_index=-100, reduction="sum")
            tot += l.item()
            cnt += int((labels[:, 1:] != -100).sum())
    test_loss = tot / cnt
    n_text = save_vlm(model, sp, args.tokenizer, args.out)
    samples = sample_answers(model, tok, sp, common.read_jsonl(common.GSM8K_TEST, 3))
    summary = {"params": n_params, "text_tensor_params": n_text, "steps": total, "steps_per_epoch": per_epoch,
               "epochs": args.epochs, "batch_tokens": args.batch_tokens, "lr": args.lr, "seed": args.seed,
               "train_s": round(train_s, 1), "final_train_loss_ema": round(ema, 4),
               "test200_loss": round(test_loss, 4), "curve": curve, "samples": samples,
               "bytes": os.path.getsize(os.path.join(args.out, "model.safetensors"))}
    with open(os.path.join(args.work, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for s in samples:
        common.log("---\n" + s)
    common.log(f"done: train {train_s:.0f}s, final loss ema {ema:.4f}, test loss {test_loss:.4f}")


if __name__ == "__main__":
    main()
