"""A drafter training loop that asks dfl, every N steps, what its checkpoint really accepts
(docs/python.md, "Scoring each checkpoint of a training loop").

    python tools/train/loop_example.py [--steps 60] [--every 20] [--train 24] [--eval 8] [--work DIR]

1. dfl records the target once (dflash_eval.eval with save_features and train_metrics): the
   target's greedy answers to GSM8K train questions and the hidden states of the layers the drafter
   reads; these files are also this loop's training data (the target's own answers, as DFlash
   training wants) — a held-out set of test questions is recorded the same way for scoring;
2. the loop trains the embedded drafter (models/drafter, z-lab's DFlashDraftModel) with the DFlash
   recipe (tools/train/dflash_recipe.py: random anchors, [x_t, MASK x 15] blocks, decay-weighted
   cross-entropy; the target's embedding and lm_head frozen);
3. every --every steps it saves a checkpoint and replays it on the held-out recording
   (dflash_eval.replay: no target forward), logging its training accuracy next to dfl's real tau,
   per-position acceptance, and the training-time metrics dfl computes on the same sequences.
Runs on a CPU in about a minute with the defaults (torch, transformers, z-lab's dflash and the
dflash_eval package: pip install ".[record]" dflash)."""
import argparse
import json
import os
import sys
import tempfile

import torch
from safetensors import safe_open

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import dflash_recipe as R  # noqa: E402

import dflash_eval as dfl  # noqa: E402

BLOCK = 16


def recording(target, drafter, prompts, out, limit, max_new):
    """dfl's recording of the target on prompts: (summary, features dir)."""
    feat = os.path.join(out, "features")
    s = dfl.eval(target, drafter, prompts, out=os.path.join(out, "eval"), format="gsm8k", limit=limit,
                 max_new=max_new, save_features=feat, train_metrics=True, cost_reps=0, quiet=True)
    return s, feat


def load_items(feat, layers):
    """Training items from a features directory: ids (prompt + response), the prompt length, the
    features of every position [T, n_layers * H] (the last position has none: zeros, never read)."""
    items = []
    with open(os.path.join(feat, "manifest.jsonl")) as f:
        files = [json.loads(x) for x in f if x.strip()]
    for m in files:
        with safe_open(os.path.join(feat, m["file"]), "pt") as f:
            inp, truth = f.get_tensor("input_ids"), f.get_tensor("truth_ids")
            x = torch.cat([f.get_tensor(f"layer.{k}") for k in layers], dim=-1)
        n = m["tokens"]
        ids = torch.cat([inp, truth[n - 1:n]])
        items.append({"ids": ids, "plen": m["prompt_tokens"], "feat": torch.cat([x, torch.zeros(1, x.shape[1])])})
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=os.path.join(common.SOURCE, "models", "target"))
    ap.add_argument("--drafter", default=os.path.join(common.SOURCE, "models", "drafter"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--train", type=int, default=24, help="GSM8K train questions recorded for training")
    ap.add_argument("--eval", type=int, default=8, help="GSM8K test questions recorded for scoring")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = a.work or tempfile.mkdtemp(prefix="dfl-loop-")
    _, train_feat = recording(a.target, a.drafter, common.GSM8K_TRAIN, os.path.join(work, "train"), a.train, a.max_new)
    _, eval_feat = recording(a.target, a.drafter, common.GSM8K_TEST, os.path.join(work, "heldout"), a.eval, a.max_new)

    from dflash.model import DFlashDraftModel
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    drafter = DFlashDraftModel.from_pretrained(a.drafter, dtype=torch.float32).train()
    layers = list(drafter.target_layer_ids)
    mask_id = int(drafter.mask_token_id)
    items = load_items(train_feat, layers)
    import train_drafter as TD  # the embedded trainer's batching and loss
    TD.BLOCK = BLOCK
    opt = torch.optim.AdamW(drafter.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    weights = R.loss_weights(BLOCK, R.default_gamma(BLOCK))
    gen = torch.Generator().manual_seed(0)
    for step in range(1, a.steps + 1):
        batch_items = [items[(step * 4 + i) % len(items)] for i in range(4)]
        batch = TD.make_batch(batch_items, 32, mask_id, gen)
        loss, _, acc_k = TD.drafter_loss(drafter, target.get_input_embeddings(), target.lm_head, batch, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % a.every == 0:
            ckpt = os.path.join(work, f"ckpt-{step}")
            drafter.save_pretrained(ckpt)
            s = dfl.replay(eval_feat, ckpt, [0], train_metrics=True, quiet=True)
            chain = s["results"][0]
            tv = s["train_vs_serve"]["drafters"][0]
            rnd = next(x for x in tv["sets"] if x["labels"] == "target")["random_anchors"]
            print(f"step {step}: loss {loss.item():.3f}, training accuracy k=1 {acc_k[0]:.3f} | dfl on held-out: "
                  f"tau {chain['tau']:.3f}, per-position {[round(p, 2) for p in chain['per_position'][:4]]}, "
                  f"SpecForge accuracy {rnd['accuracy']:.3f}, simulated length {rnd['simulated_acceptance_length']:.3f}",
                  flush=True)
    print(f"[loop_example] checkpoints and recordings in {work}")


if __name__ == "__main__":
    main()
