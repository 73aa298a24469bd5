"""Stage 3: train the embedded DFlash drafter (z-lab DFlashDraftModel) on the target's own greedy
answers, with the recipe of docs/design.md §8 (dflash_recipe.py).

    python tools/train/train_drafter.py regen    --target models/target --n 2000     # dfl greedy answers
    python tools/train/train_drafter.py features --target models/target              # target layer outputs
    python tools/train/train_drafter.py train    --target models/target --out models/drafter

regen: the first N GSM8K train questions, `dfl generate --chat chatml --max-new 256` (greedy, C
engine), kept as (prompt ids, response ids) in build/train/drafter/regen.jsonl.
features: the target runs over prompt + response (`dfl hidden`, the C engine's prefill; or
--engine hf: transformers float32 from the saved BF16 checkpoint); the outputs of decoder layers
TARGET_LAYERS (= transformers hidden_states[k+1]) are concatenated and kept (bf16) in
build/train/drafter/features.pt. With dfl, a few sequences are checked against transformers.
train: per sequence up to --anchors random anchors in the response; blocks of 16 = [x_t, MASK x 15];
each block attends to the target features of positions < t and to itself only (one attention mask
over [context ; blocks]); loss = decay-weighted CE (gamma 7); the target's embedding and lm_head are
shared and frozen; AdamW lr 6e-4, 4% warmup, cosine, grad clip 1.0. Saved BF16.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import time

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Qwen3Config
from transformers.utils import logging as hf_logging

import common
import dflash_recipe as R
from dflash.model import DFlashDraftModel

TARGET_LAYERS = [1, 3, 5, 6]
BLOCK = 16
WORKDIR = os.path.join(common.WORK, "drafter")


def specials(target):
    with open(os.path.join(target, "tokenizer.json")) as f:
        return {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}


def dfl_env():
    """dfl with one OpenMP thread: on 2 shared, oversubscribed cores a tiny model runs ~100x faster
    than with spinning OpenMP teams (DFL_OMP_THREADS overrides)."""
    return dict(os.environ, OMP_NUM_THREADS=os.environ.get("DFL_OMP_THREADS", "1"))


def dfl_generate(target, question, max_new, drafter=None, extra=()):
    cmd = [common.DFL, "generate", "--target", target, "--prompt", question, "--chat", "chatml",
           "--max-new", str(max_new), "--json", *extra]
    if drafter:
        cmd += ["--drafter", drafter]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dfl_env())
    if p.returncode != 0:
        raise RuntimeError(f"dfl failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def cmd_regen(args):
    os.makedirs(WORKDIR, exist_ok=True)
    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    rows = common.read_jsonl(common.GSM8K_TRAIN, args.n)
    t0 = time.time()
    out_path = os.path.join(WORKDIR, "regen.jsonl")
    n_tok = 0
    with open(out_path, "w") as f:
        for i, ex in enumerate(rows):
            r = dfl_generate(args.target, ex["question"], args.max_new)
            prompt = tok.encode(common.chat_prompt(ex["question"])).ids
            assert len(prompt) == r["stats"]["prompt_tokens"], "python and dfl prompt tokenization differ"
            f.write(json.dumps({"prompt": prompt, "response": r["tokens"], "stop": r["stats"]["stop"]}) + "\n")
            n_tok += len(r["tokens"])
            if (i + 1) % 100 == 0:
                common.log(f"regen {i + 1}/{len(rows)} {n_tok} tokens {time.time() - t0:.0f}s")
    common.log(f"regen: {len(rows)} answers, {n_tok} tokens in {time.time() - t0:.0f}s -> {out_path}")


def load_target(path):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@torch.no_grad()
def hf_features(target, seqs):
    """Target layer outputs by transformers (float32), batched with right padding."""
    feats = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for b in range(0, len(order), 16):
        idx = order[b:b + 16]
        T = max(len(seqs[i]) for i in idx)
        ids = torch.zeros(len(idx), T, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i])  # right padding: causal, never reaches real positions
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        f = torch.cat([hs[k + 1] for k in TARGET_LAYERS], dim=-1)
        for r, i in enumerate(idx):
            feats[i] = f[r, :len(seqs[i])].clone()
    return feats


def dfl_features(target, ids):
    """Target layer outputs by `dfl hidden` (the C engine's own prefill)."""
    path = os.path.join(WORKDIR, "_hidden.safetensors")
    p = subprocess.run([common.DFL, "hidden", "--target", target, "--layers", ",".join(map(str, TARGET_LAYERS)),
                        "--prompt-ids", ",".join(map(str, ids)), "--out", path], capture_output=True, text=True,
                       env=dfl_env())
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    t = load_file(path)
    return torch.cat([t[f"layer.{k}"] for k in TARGET_LAYERS], dim=-1)


def cmd_features(args):
    torch.set_num_threads(args.threads)
    seqs = [json.loads(l) for l in open(os.path.join(WORKDIR, "regen.jsonl"))]
    ids = [s["prompt"] + s["response"] for s in seqs]
    t0 = time.time()
    if args.engine == "hf":
        feats = hf_features(load_target(args.target), ids)
    else:
        feats = []
        for i, x in enumerate(ids):
            feats.append(dfl_features(args.target, x))
            if (i + 1) % 200 == 0:
                common.log(f"features {i + 1}/{len(ids)} {time.time() - t0:.0f}s")
        # the two engines agree (sanity check on a few sequences)
        ref = hf_features(load_target(args.target), ids[:4])
        err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(feats[:4], ref))
        common.log(f"dfl vs transformers features, max rel err on 4 sequences: {err:.2e}")
        assert err < 1e-3, err
    out = [{"ids": torch.tensor(x), "plen": len(s["prompt"]), "feat": f.to(torch.bfloat16)}
           for x, s, f in zip(ids, seqs, feats)]
    torch.save(out, os.path.join(WORKDIR, "features.pt"))
    common.log(f"features ({args.engine}): {len(out)} sequences, {sum(len(x) for x in ids)} positions "
               f"in {time.time() - t0:.0f}s")


def drafter_config(sp, args, tcfg):
    return Qwen3Config(architectures=["DFlashDraftModel"], vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size,
                       num_hidden_layers=args.layers, intermediate_size=args.intermediate, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=tcfg.hidden_size // 4, max_position_embeddings=4096, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e7}, tie_word_embeddings=False,
                       bos_token_id=sp["<|endoftext|>"], eos_token_id=sp["<|im_end|>"],
                       pad_token_id=sp["<|endoftext|>"], block_size=BLOCK, num_target_layers=tcfg.num_hidden_layers,
                       dflash_config={"mask_token_id": sp["<|mask|>"], "target_layer_ids": TARGET_LAYERS})


def make_batch(items, anchors_per_seq, mask_id, gen):
    """Pad S sequences' contexts and blocks into one drafter batch."""
    S = len(items)
    per = []
    for it in items:
        T = len(it["ids"])
        lm = torch.zeros(T, dtype=torch.bool)
        lm[it["plen"]:] = True
        a = R.sample_anchors(lm, anchors_per_seq, gen)
        per.append((a,) + R.build_blocks(it["ids"], lm, a, BLOCK, mask_id))
    L = max(len(it["ids"]) for it in items)
    n = max(len(p[0]) for p in per)
    F = items[0]["feat"].shape[-1]
    feat = torch.zeros(S, L, F)
    block_ids = torch.full((S, n, BLOCK), mask_id, dtype=torch.long)
    pos = torch.zeros(S, L + n * BLOCK, dtype=torch.long)
    labels = torch.zeros(S, n, BLOCK - 1, dtype=torch.long)
    valid = torch.zeros(S, n, BLOCK - 1, dtype=torch.bool)
    mask = torch.zeros(S, 1, n * BLOCK, L + n * BLOCK, dtype=torch.bool)
    for s, (it, (a, bi, bp, lab, val)) in enumerate(zip(items, per)):
        T, k = len(it["ids"]), len(a)
        feat[s, :T] = it["feat"].float()
        pos[s, :L] = torch.arange(L)
        padded_a = torch.cat([a, torch.zeros(n - k, dtype=torch.long)])  # padding blocks: anchor 0, no labels
        bp_full = padded_a[:, None] + torch.arange(BLOCK)[None, :]
        pos[s, L:] = bp_full.flatten()
        block_ids[s, :k] = bi
        labels[s, :k] = lab
        valid[s, :k] = val
        mask[s, 0] = R.block_attention_mask(padded_a, BLOCK, L, ctx_valid=T)
    return feat, block_ids, pos, labels, valid, mask


def drafter_loss(drafter, embed, head, batch, weights):
    feat, block_ids, pos, labels, valid, mask = batch
    S, n = block_ids.shape[:2]
    noise = embed(block_ids).view(S, n * BLOCK, -1)
    hid = drafter(position_ids=pos, attention_mask=mask, noise_embedding=noise, target_hidden=feat)
    hid = hid.view(S, n, BLOCK, -1)[:, :, 1:]
    logits = head(hid)
    return R.weighted_ce(logits, labels, valid, weights)


def cmd_train(args):
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    sp = specials(args.target)
    target = load_target(args.target)
    embed = target.get_input_embeddings()
    head = target.lm_head
    data = torch.load(os.path.join(WORKDIR, "features.pt"))
    if args.max_seqs:
        data = data[:args.max_seqs]
    rng = random.Random(args.seed)
    hold = data[-args.holdout:]
    data = data[:-args.holdout]
    drafter = DFlashDraftModel(drafter_config(sp, args, target.config))
    drafter.train()
    n_params = sum(p.numel() for p in drafter.parameters())
    per_epoch = (len(data) + args.batch - 1) // args.batch
    total = int(per_epoch * args.epochs)
    warm = max(1, int(0.04 * total))
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    weights = R.loss_weights(BLOCK, R.default_gamma(BLOCK))
    common.log(f"drafter {n_params / 1e6:.2f}M params; {len(data)} train seqs, {len(hold)} held out; "
               f"{total} steps ({per_epoch}/epoch), anchors/seq {args.anchors}, batch {args.batch}")
    t0 = time.time()
    curve, step, ema = [], 0, None

    def evaluate():
        drafter.eval()
        g = torch.Generator().manual_seed(123)
        with torch.no_grad():
            tot, ce_k, acc_k, nb = 0.0, 0, 0, 0
            for i in range(0, len(hold), args.batch):
                l, c, a = drafter_loss(drafter, embed, head, make_batch(hold[i:i + args.batch], 64, sp["<|mask|>"], g),
                                       weights)
                tot, ce_k, acc_k, nb = tot + l.item(), ce_k + c, acc_k + a, nb + 1
        drafter.train()
        acc = acc_k / nb
        # expected chain length if per-position accuracies were independent of each other
        exp_tau = 1 + float(torch.cumprod(acc, 0).sum())
        return tot / nb, acc, exp_tau

    while step < total:
        order = list(range(len(data)))
        rng.shuffle(order)
        for b in range(0, len(order), args.batch):
            if step >= total:
                break
            batch = make_batch([data[i] for i in order[b:b + args.batch]], args.anchors, sp["<|mask|>"], gen)
            lr = R.cosine_lr(step, total, args.lr, warm)
            for g_ in opt.param_groups:
                g_["lr"] = lr
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast):
                loss, ce_k, acc_k = drafter_loss(drafter, embed, head, batch, weights)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            step += 1
            ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
            if step % 20 == 0 or step == total:
                el = time.time() - t0
                rec = {"step": step, "epoch": round(step / per_epoch, 3), "loss": round(loss.item(), 4),
                       "loss_ema": round(ema, 4), "acc1": round(float(acc_k[0]), 3), "acc8": round(float(acc_k[7]), 3),
                       "lr": lr, "elapsed_s": round(el, 1)}
                if step % args.eval_every == 0 or step == total:
                    hl, hacc, etau = evaluate()
                    rec.update({"holdout_loss": round(hl, 4), "holdout_exp_tau": round(etau, 3)})
                curve.append(rec)
                common.log(json.dumps(rec))
    train_s = time.time() - t0
    hl, hacc, etau = evaluate()
    shutil.rmtree(args.out, ignore_errors=True)
    drafter.to(torch.bfloat16)
    drafter.save_pretrained(args.out)
    for f in os.listdir(args.out):
        os.chmod(os.path.join(args.out, f), 0o644)
    summary = {"params": n_params, "steps": total, "epochs": args.epochs, "train_seqs": len(data),
               "anchors_per_seq": args.anchors, "batch_seqs": args.batch, "lr": args.lr, "seed": args.seed,
               "layers": args.layers, "target_layer_ids": TARGET_LAYERS, "train_s": round(train_s, 1),
               "final_loss_ema": round(ema, 4), "holdout_loss": round(hl, 4),
               "holdout_acc_per_k": [round(float(x), 3) for x in hacc], "holdout_exp_tau": round(etau, 3),
               "bytes": os.path.getsize(os.path.join(args.out, "model.safetensors")), "curve": curve}
    with open(os.path.join(WORKDIR, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    common.log(f"done: {train_s:.0f}s, loss ema {ema:.4f}, holdout loss {hl:.4f}, exp tau {etau:.2f}")


def main():
    global WORKDIR
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["regen", "features", "train"])
    ap.add_argument("--target", required=True)
    ap.add_argument("--out")
    ap.add_argument("--work", default=WORKDIR, help="intermediate files (default build/train/drafter)")
    ap.add_argument("--n", type=int, default=2000, help="regen: questions")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--engine", choices=["dfl", "hf"], default="dfl", help="features: who computes them")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--anchors", type=int, default=32, help="anchors per sequence per step")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--holdout", type=int, default=48)
    ap.add_argument("--max-seqs", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: 2 shared cores, oversubscribed)")
    ap.add_argument("--no-autocast", action="store_true")
    args = ap.parse_args()
    WORKDIR = args.work
    os.makedirs(WORKDIR, exist_ok=True)
    {"regen": cmd_regen, "features": cmd_features, "train": cmd_train}[args.stage](args)


if __name__ == "__main__":
    main()
