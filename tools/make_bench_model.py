"""Write the random-weight benchmark pair `dfl bench` runs on (see bench/README.md):

    python tools/make_bench_model.py [OUTDIR]        # default build/bench-model; ~1 min

OUTDIR/target: a Qwen3.5-0.8B-shaped text model written by transformers (`Qwen3_5ForCausalLM`,
save_pretrained, BF16): hidden 1024, 24 layers (full attention every 4th), head_dim 256, 8/2
heads, Gated DeltaNet 16 key / 16 value heads of 128, intermediate 3584, vocab 248320, tied
embeddings: 1.50 GB of BF16 weights. OUTDIR/drafter: a DFlash drafter for it (z-lab format
via dflash's DFlashDraftModel, BF16): 5 layers, block 16, 16/8 heads of 128, intermediate 3584,
target layers [1, 6, 11, 16, 21]. Weights are random (fixed seeds): acceptance is ~0, so the
pair measures costs, not speedups from drafting. Skips directories that already hold a model
unless --force. Not for git: OUTDIR is a build directory.
"""
import argparse
import os
import sys

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet, Qwen3_5RMSNorm
from dflash.model import DFlashDraftModel

VOCAB = 248320
MASK_ID = 248077  # an id inside the vocabulary, as Qwen3.5 drafters use a reserved special token


def target_config():
    return Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=1024, num_hidden_layers=24, intermediate_size=3584,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        layer_types=["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(24)],
        full_attention_interval=4, linear_num_key_heads=16, linear_num_value_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        attn_output_gate=True, bos_token_id=248044, eos_token_id=248046, pad_token_id=248044,
        architectures=["Qwen3_5ForCausalLM"])


def drafter_config():
    return Qwen3Config(
        architectures=["DFlashDraftModel"], vocab_size=VOCAB, hidden_size=1024, num_hidden_layers=5,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3584,
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7}, block_size=16,
        num_target_layers=24, dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": [1, 6, 11, 16, 21]})


@torch.no_grad()
def randomize(model, seed):
    """Linear and embedding weights N(0, 1/fan_in); norms near identity; Gated DeltaNet decays
    exp(g) roughly 0.3..0.95 per token."""
    g = torch.Generator().manual_seed(seed)
    for _, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.weight.shape[1] ** 0.5)
        elif isinstance(m, nn.Conv1d):
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.kernel_size[0] ** 0.5)
        elif isinstance(m, Qwen3_5RMSNorm):  # zero-centred: y = x_hat * (1 + w)
            m.weight.copy_(0.1 * torch.randn(m.weight.shape, generator=g))
        elif "RMSNorm" in type(m).__name__:
            m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=g))
        elif isinstance(m, Qwen3_5GatedDeltaNet):
            m.A_log.copy_(torch.empty(m.A_log.shape).uniform_(0.05, 1.0, generator=g).log())
            m.dt_bias.copy_(0.5 * torch.randn(m.dt_bias.shape, generator=g))
    return model


def write(model, out):
    model.to(torch.bfloat16).save_pretrained(out)
    print(f"wrote {out}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?", default=os.path.join("build", "bench-model"))
    ap.add_argument("--force", action="store_true", help="rewrite existing models")
    a = ap.parse_args()
    torch.manual_seed(0)
    for name, build in (("target", lambda: randomize(Qwen3_5ForCausalLM(target_config()), 1)),
                        ("drafter", lambda: randomize(DFlashDraftModel(drafter_config()), 2))):
        out = os.path.join(a.outdir, name)
        if os.path.exists(os.path.join(out, "config.json")) and not a.force:
            print(f"{out}: exists (--force rewrites)")
            continue
        write(build(), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
