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

    python tools/make_bench_model.py --moe qwen3_5_moe [OUTDIR]   # OUTDIR/qwen3_5_moe; ~1 min
    python tools/make_bench_model.py --moe qwen3_moe [OUTDIR]     # OUTDIR/qwen3_moe

An MoE bench target instead (no drafter; `dfl bench --model OUTDIR/qwen3_5_moe --drafter none`),
written by transformers (save_pretrained, BF16, experts per expert), hidden 1024, 8 layers,
64 routed experts of inner size 256, top-4 (Qwen3-30B-A3B's 128 / 8 ratio), vocab 32768 tied (so
that the experts hold most of the weights, as in the released MoE models):
qwen3_5_moe (`Qwen3_5MoeForCausalLM`): LLLF x 2 as the 0.8B-shaped target, plus a shared expert
of inner size 512 with its gate; qwen3_moe (`Qwen3MoeForCausalLM`): 16/4 heads of 64, routing
weights renormalised. About 1 GB each; `dfl bench` prints the experts each verification touches.
"""
import argparse
import os
import sys

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet, Qwen3_5RMSNorm
from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (Qwen3_5MoeExperts, Qwen3_5MoeGatedDeltaNet,
                                                                  Qwen3_5MoeRMSNorm, Qwen3_5MoeTopKRouter)
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeTopKRouter
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


# a 32768-token vocabulary so that, as in the released MoE models, the experts hold most of the
# weights (with Qwen's 248320 rows the lm_head alone would outweigh them); bench tokens are random
MOE_VOCAB = 32768
MOE = dict(vocab_size=MOE_VOCAB, hidden_size=1024, num_hidden_layers=8, num_experts=64, num_experts_per_tok=4,
           moe_intermediate_size=256, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
           bos_token_id=1, eos_token_id=2, pad_token_id=1)


def moe_config(arch):
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**MOE, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                              norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                              architectures=["Qwen3MoeForCausalLM"])
    return Qwen3_5MoeTextConfig(
        **MOE, shared_expert_intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        layer_types=["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(8)],
        linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        architectures=["Qwen3_5MoeForCausalLM"])


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
        if isinstance(m, (nn.Linear, nn.Embedding, Qwen3MoeTopKRouter, Qwen3_5MoeTopKRouter)):
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.weight.shape[1] ** 0.5)
        elif isinstance(m, (Qwen3MoeExperts, Qwen3_5MoeExperts)):  # [E, 2I, H], [E, H, I]
            m.gate_up_proj.copy_(torch.randn(m.gate_up_proj.shape, generator=g) / m.gate_up_proj.shape[2] ** 0.5)
            m.down_proj.copy_(torch.randn(m.down_proj.shape, generator=g) / m.down_proj.shape[2] ** 0.5)
        elif isinstance(m, nn.Conv1d):
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.kernel_size[0] ** 0.5)
        elif isinstance(m, (Qwen3_5RMSNorm, Qwen3_5MoeRMSNorm)):  # zero-centred: y = x_hat * (1 + w)
            m.weight.copy_(0.1 * torch.randn(m.weight.shape, generator=g))
        elif "RMSNorm" in type(m).__name__:
            m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=g))
        elif isinstance(m, (Qwen3_5GatedDeltaNet, Qwen3_5MoeGatedDeltaNet)):
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
    ap.add_argument("--moe", choices=("qwen3_5_moe", "qwen3_moe"), help="write an MoE bench target instead")
    a = ap.parse_args()
    torch.manual_seed(0)
    models = (("target", lambda: randomize(Qwen3_5ForCausalLM(target_config()), 1)),
              ("drafter", lambda: randomize(DFlashDraftModel(drafter_config()), 2)))
    if a.moe:
        cls = Qwen3MoeForCausalLM if a.moe == "qwen3_moe" else Qwen3_5MoeForCausalLM
        models = ((a.moe, lambda: randomize(cls(moe_config(a.moe)), 3)),)
    for name, build in models:
        out = os.path.join(a.outdir, name)
        if os.path.exists(os.path.join(out, "config.json")) and not a.force:
            print(f"{out}: exists (--force rewrites)")
            continue
        write(build(), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
