"""Write the tiny random-weight checkpoints the C tests load (see docs/fixtures.md).

    python tools/make_fixtures.py OUTDIR [--force] [--only NAME ...]

Every fixture is written by transformers itself (save_pretrained), from fixed seeds, into
OUTDIR/<name>/. A fixture whose directory holds a stamp (written last) that matches this script's
hash is skipped unless --force, so editing this file or fixture_tokenizer.py regenerates all.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import zlib

# MKL picks its code path by CPU (AVX-512 on Intel Xeons, another elsewhere) and its vectorized log
# (A_log's init) and matrix products differ in the last bit between paths: the fixtures' bytes, and
# test_cpu_pin's pinned hashes with them, would depend on the machine. The compatible path gives
# the same bits on every x86-64 CPU (read when MKL first runs, so before torch computes anything).
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.utils import logging as hf_logging
from transformers.models.qwen3_5 import (Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
                                         Qwen3_5TextConfig)
from transformers.models.qwen3_5.modeling_qwen3_5 import (Qwen3_5GatedDeltaNet, Qwen3_5RMSNorm,
                                                          Qwen3_5RMSNormGated, Qwen3_5VisionModel)
from transformers.models.qwen3_5_moe import (Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM,
                                             Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeTextConfig)
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (Qwen3_5MoeExperts, Qwen3_5MoeGatedDeltaNet,
                                                                  Qwen3_5MoeRMSNorm, Qwen3_5MoeTopKRouter)
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeTopKRouter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixture_tokenizer  # noqa: E402
import make_fp8  # noqa: E402
from dflash.model import DFlashDraftModel  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "reference"))
from dflash2_reference import DFlash2DraftModel  # noqa: E402

STAMP = "fixture.stamp"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VOCAB = 1024  # model rows >= tokenizer size (1000)


def script_hash():
    h = hashlib.sha256()
    for f in ("make_fixtures.py", "fixture_tokenizer.py", "make_fp8.py"):
        with open(os.path.join(HERE, f), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Random but reasonable weights. Each tensor gets its own generator seeded from (seed, name), so
# a weight does not depend on construction order. Linear weights ~ N(0, 1/fan_in) keep every
# layer's contribution O(1) (transformers' std 0.02 leaves the residual stream to the embeddings
# and greedy decoding of a tied model just repeats a token); embeddings / lm_head are N(0, 1/H)
# and the final norm's gain is ~LOGIT_STD so logits have std ~3; other norm weights are
# perturbed around their identity value so a `w` vs `1 + w` mix-up shows.
LOGIT_STD = 3.0
FINAL_NORMS = ("model.norm", "model.language_model.norm", "norm")


def _gen(seed, name):
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def _normal(t, g, std, mean=0.0):
    t.copy_(torch.randn(t.shape, generator=g) * std + mean)


@torch.no_grad()
def randomize(model, seed):
    for mname, m in model.named_modules():
        if isinstance(m, Qwen3_5VisionModel) or ".visual." in f".{mname}.":
            continue  # transformers' default init is fine for the (unused) vision tower
        g = _gen(seed, mname)
        gain = LOGIT_STD if mname in FINAL_NORMS else 1.0
        if isinstance(m, (Qwen3_5RMSNorm, Qwen3_5MoeRMSNorm)):  # zero-centred: y = x_hat * (1 + w)
            _normal(m.weight, g, 0.1, mean=gain - 1.0)
        elif "RMSNorm" in type(m).__name__:  # Qwen3RMSNorm, Qwen3_5RMSNormGated: y = w * x_hat
            _normal(m.weight, g, 0.1, mean=gain)
        elif isinstance(m, (nn.Embedding, nn.Linear, Qwen3MoeTopKRouter, Qwen3_5MoeTopKRouter)):
            _normal(m.weight, g, 1.0 / m.weight.shape[1] ** 0.5)  # routers: logits std ~1, routing spread
        elif isinstance(m, (Qwen3MoeExperts, Qwen3_5MoeExperts)):  # [E, 2I, H] and [E, H, I]: N(0, 1/fan_in)
            _normal(m.gate_up_proj, g, 1.0 / m.gate_up_proj.shape[2] ** 0.5)
            _normal(m.down_proj, g, 1.0 / m.down_proj.shape[2] ** 0.5)
        elif isinstance(m, nn.Conv1d):
            _normal(m.weight, g, 1.0 / m.kernel_size[0] ** 0.5)
        elif isinstance(m, (Qwen3_5GatedDeltaNet, Qwen3_5MoeGatedDeltaNet)):
            # decay exp(g) per token roughly 0.3..0.95, so the recurrent state matters
            m.A_log.copy_(torch.empty(m.A_log.shape).uniform_(0.05, 1.0, generator=g).log())
            _normal(m.dt_bias, g, 0.5)
    return model


# ---------------------------------------------------------------------------------------------
# Writing

def generation_config(tok):
    return GenerationConfig(bos_token_id=tok["<|endoftext|>"], pad_token_id=tok["<|endoftext|>"],
                            eos_token_id=[tok["<|im_end|>"], tok["<|endoftext|>"]], do_sample=False)


def save(model, out, tok, tokdir, dtype=torch.float32, max_shard_size=None):
    model.generation_config = generation_config(tok)
    model.to(dtype)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kw)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokdir, f), os.path.join(out, f))


def edit_config(out, fn):
    path = os.path.join(out, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    fn(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def special_ids(tok):
    return {"bos_token_id": tok["<|endoftext|>"], "eos_token_id": tok["<|im_end|>"],
            "pad_token_id": tok["<|endoftext|>"]}


# ---------------------------------------------------------------------------------------------
# Qwen3 dense targets

def qwen3_config(tok, **kw):
    return Qwen3Config(vocab_size=VOCAB, max_position_embeddings=4096, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       **special_ids(tok), **kw)


def make_qwen3_tiny(out, tok, tokdir):
    torch.manual_seed(1)
    cfg = qwen3_config(tok, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, intermediate_size=128, tie_word_embeddings=True)
    save(randomize(Qwen3ForCausalLM(cfg), 1), out, tok, tokdir)


def make_qwen3_bf16(out, tok, tokdir):
    torch.manual_seed(2)
    cfg = qwen3_config(tok, hidden_size=96, num_hidden_layers=5, num_attention_heads=6,
                       num_key_value_heads=2, head_dim=32, intermediate_size=192, tie_word_embeddings=False)
    save(randomize(Qwen3ForCausalLM(cfg), 2), out, tok, tokdir, dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Qwen3.5 hybrid targets

def qwen35_text_config(tok, tied, **kw):
    n = int(kw["head_dim"] * 0.25) // 2  # rotated pairs; split T/H/W like Qwen's [11, 11, 10] of 32
    a = -(-n // 3)
    b = -(-(n - a) // 2)
    mrope = [a, b, n - a - b]
    return dict(vocab_size=VOCAB, max_position_embeddings=4096, rms_norm_eps=1e-6,
                tie_word_embeddings=tied, linear_conv_kernel_dim=4,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": mrope, "mrope_interleaved": True},
                attn_output_gate=True, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
                **special_ids(tok), **kw)


TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                   temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)


def qwen35_vlm_config(tok, tied, **text):
    t = qwen35_text_config(tok, tied, **text)
    return Qwen3_5Config(text_config=t, vision_config=dict(TINY_VISION, out_hidden_size=t["hidden_size"]),
                         tie_word_embeddings=tied, vision_start_token_id=1000, vision_end_token_id=1001,
                         image_token_id=1002, video_token_id=1003)  # unused rows past the tokenizer


def add_mtp(out, model, seed, dtype):
    """Append `mtp.*` tensors (one gated full-attention layer, fc over [emb; hidden]) as released
    Qwen3.5 checkpoints carry them; transformers ignores them. On a Qwen3.5-MoE model the layer's
    MLP is a sparse MoE block with its experts fused, as Qwen3.5/3.6-35B-A3B ship it."""
    c = model.config.get_text_config()
    H, hd = c.hidden_size, c.head_dim
    shapes = {
        "mtp.fc.weight": [H, 2 * H],
        "mtp.pre_fc_norm_embedding.weight": [H],
        "mtp.pre_fc_norm_hidden.weight": [H],
        "mtp.norm.weight": [H],
        "mtp.layers.0.input_layernorm.weight": [H],
        "mtp.layers.0.post_attention_layernorm.weight": [H],
        "mtp.layers.0.self_attn.q_proj.weight": [c.num_attention_heads * hd * 2, H],
        "mtp.layers.0.self_attn.k_proj.weight": [c.num_key_value_heads * hd, H],
        "mtp.layers.0.self_attn.v_proj.weight": [c.num_key_value_heads * hd, H],
        "mtp.layers.0.self_attn.o_proj.weight": [H, c.num_attention_heads * hd],
        "mtp.layers.0.self_attn.q_norm.weight": [hd],
        "mtp.layers.0.self_attn.k_norm.weight": [hd],
    }
    mlp = "mtp.layers.0.mlp."
    if getattr(c, "num_experts", 0):
        E, Ie, Is = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
        shapes.update({mlp + "gate.weight": [E, H], mlp + "experts.gate_up_proj": [E, 2 * Ie, H],
                       mlp + "experts.down_proj": [E, H, Ie], mlp + "shared_expert.gate_proj.weight": [Is, H],
                       mlp + "shared_expert.up_proj.weight": [Is, H], mlp + "shared_expert.down_proj.weight": [H, Is],
                       mlp + "shared_expert_gate.weight": [1, H]})
    else:
        I = c.intermediate_size
        shapes.update({mlp + "gate_proj.weight": [I, H], mlp + "up_proj.weight": [I, H],
                       mlp + "down_proj.weight": [H, I]})
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    for name, shape in shapes.items():
        g = _gen(seed, name)
        std = 0.1 if len(shape) == 1 else 1.0 / shape[-1] ** 0.5
        tensors[name] = (torch.randn(shape, generator=g) * std).to(dtype)
    save_file(tensors, path, metadata={"format": "pt"})


QWEN35_VLM = dict(hidden_size=128, num_hidden_layers=8, intermediate_size=256,
                  layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
                  + ["full_attention"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                  linear_value_head_dim=32, full_attention_interval=4)  # released files carry both


def build_qwen35_vlm(tok):
    torch.manual_seed(3)
    return randomize(Qwen3_5ForConditionalGeneration(qwen35_vlm_config(tok, True, **QWEN35_VLM)), 3)


def text_only(vlm):
    """The same weights as a text-only Qwen3_5ForCausalLM (model.language_model.* -> model.*)."""
    cfg = Qwen3_5TextConfig(**vlm.config.text_config.to_dict())
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    model = Qwen3_5ForCausalLM(cfg)
    sd = {k.replace("model.language_model.", "model."): v for k, v in vlm.state_dict().items()
          if not k.startswith("model.visual.")}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if not cfg.tie_word_embeddings:
        raise AssertionError("text_only expects tied weights here")
    return model


def make_qwen35_vlm(out, tok, tokdir):
    model = build_qwen35_vlm(tok)
    save(model, out, tok, tokdir)
    add_mtp(out, model, 3, torch.float32)


# Prompts the qwen35_mtp head is fitted on (tests/py/test_mtp.py decodes them, and evaluates the
# texts with --chat none: drafts get accepted there).
MTP_FIT_PROMPTS = [[11, 200, 37, 512, 99, 3, 641, 77, 12], [5, 6, 7, 8, 9, 10, 11, 12], [300, 301, 302],
                   [949, 459, 688, 340, 258, 209]]
MTP_FIT_TEXTS = ["The cat sat on the mat.", "Two plus two is four.", "Where is the red ball?"]


def make_qwen35_mtp(out, tok, tokdir):
    """qwen35_vlm's target with its MTP head fitted to the target's own greedy continuations of
    MTP_FIT_PROMPTS (mtp_reference.fit_mtp), so that MTP drafts are accepted there."""
    make_qwen35_vlm(out, tok, tokdir)
    fit_mtp_head(out, tokdir)


def fit_mtp_head(out, tokdir):
    """Fit OUTDIR's mtp.* tensors on the target's greedy continuations of the MTP_FIT prompts."""
    sys.path.insert(0, os.path.join(HERE, "reference"))
    import mtp_reference
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    mtp = {k: v for k, v in tensors.items() if k.startswith("mtp.")}
    from tokenizers import Tokenizer
    enc = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json"))
    prompts = MTP_FIT_PROMPTS + [enc.encode(x).ids for x in MTP_FIT_TEXTS]
    mtp_reference.fit_mtp(mtp_reference.load_target(out), mtp, prompts, 40, 100, 3e-3, 0)
    tensors.update(mtp)
    save_file(tensors, path, metadata={"format": "pt"})


def make_qwen35_text(out, tok, tokdir):
    save(text_only(build_qwen35_vlm(tok)), out, tok, tokdir)


def make_qwen35_sharded(out, tok, tokdir):
    save(text_only(build_qwen35_vlm(tok)), out, tok, tokdir, max_shard_size="1MB")


def make_qwen35_bf16(out, tok, tokdir):
    torch.manual_seed(5)
    cfg = qwen35_vlm_config(tok, False, hidden_size=96, num_hidden_layers=6, intermediate_size=192,
                            full_attention_interval=3, num_attention_heads=3, num_key_value_heads=1,
                            head_dim=32, linear_num_key_heads=1, linear_num_value_heads=3,
                            linear_key_head_dim=32, linear_value_head_dim=32)
    model = randomize(Qwen3_5ForConditionalGeneration(cfg), 5)
    save(model, out, tok, tokdir, dtype=torch.bfloat16)
    add_mtp(out, model, 5, torch.bfloat16)

    def use_interval(c):  # as some exports do: no layer_types, only the interval
        c["text_config"].pop("layer_types")
        c["text_config"]["full_attention_interval"] = 3
    edit_config(out, use_interval)


def make_qwen35_r1(out, tok, tokdir):
    torch.manual_seed(6)
    cfg = Qwen3_5TextConfig(**qwen35_text_config(
        tok, False, hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=32, linear_value_head_dim=32))
    save(randomize(Qwen3_5ForCausalLM(cfg), 6), out, tok, tokdir)


# ---------------------------------------------------------------------------------------------
# Mixture-of-experts targets. save_pretrained writes the routed experts per expert
# (mlp.experts.{e}.{gate,up,down}_proj.weight, as Qwen3-30B-A3B ships); the *_fused fixtures hold
# the same weights with the experts fused as transformers' parameters (mlp.experts.gate_up_proj
# [E, 2I, H], mlp.experts.down_proj [E, H, I]), the layout of the released Qwen3.5 MoE checkpoints.

def fuse_experts(out, model):
    """Rewrite OUTDIR/model.safetensors with the experts as the model's own fused parameters."""
    path = os.path.join(out, "model.safetensors")
    tensors = {k: v for k, v in load_file(path).items() if ".mlp.experts." not in k}
    for k, v in model.state_dict().items():
        if k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            tensors[k] = v.contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def qwen3_moe_config(tok, **kw):
    return Qwen3MoeConfig(vocab_size=VOCAB, max_position_embeddings=4096, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **special_ids(tok), **kw)


def build_qwen3_moe(tok):
    torch.manual_seed(11)
    cfg = qwen3_moe_config(tok, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32, intermediate_size=128, moe_intermediate_size=32,
                           num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[2],
                           tie_word_embeddings=True)
    return randomize(Qwen3MoeForCausalLM(cfg), 11)


def make_qwen3_moe(out, tok, tokdir):
    save(build_qwen3_moe(tok), out, tok, tokdir)


def make_qwen3_moe_fused(out, tok, tokdir):
    model = build_qwen3_moe(tok)
    save(model, out, tok, tokdir)
    fuse_experts(out, model)


def make_qwen3_moe_bf16(out, tok, tokdir):
    torch.manual_seed(12)
    cfg = qwen3_moe_config(tok, hidden_size=96, num_hidden_layers=4, num_attention_heads=6,
                           num_key_value_heads=2, head_dim=32, intermediate_size=192, moe_intermediate_size=48,
                           num_experts=6, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2,
                           tie_word_embeddings=False)
    save(randomize(Qwen3MoeForCausalLM(cfg), 12), out, tok, tokdir, dtype=torch.bfloat16)


QWEN35_MOE = dict(hidden_size=64, num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
                  linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
                  moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
                  num_experts_per_tok=2)


def build_qwen35_moe_vlm(tok):
    torch.manual_seed(13)
    t = qwen35_text_config(tok, True, **QWEN35_MOE)
    for k in ("attn_output_gate", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"):
        t.pop(k)
    cfg = Qwen3_5MoeConfig(text_config=t, vision_config=dict(TINY_VISION, out_hidden_size=t["hidden_size"]),
                           tie_word_embeddings=True, vision_start_token_id=1000, vision_end_token_id=1001,
                           image_token_id=1002, video_token_id=1003)
    return randomize(Qwen3_5MoeForConditionalGeneration(cfg), 13)


def make_qwen35_moe_vlm(out, tok, tokdir):
    save(build_qwen35_moe_vlm(tok), out, tok, tokdir)


def make_qwen35_moe_mtp(out, tok, tokdir):
    """qwen35_moe_vlm's target with an MoE MTP head in the released layout (fused experts, shared
    expert), fitted as qwen35_mtp's is."""
    model = build_qwen35_moe_vlm(tok)
    save(model, out, tok, tokdir)
    add_mtp(out, model, 13, torch.float32)
    edit_config(out, lambda c: c["text_config"].update(mtp_num_hidden_layers=1))  # as released configs say
    fit_mtp_head(out, tokdir)


def make_qwen35_moe_fused(out, tok, tokdir):
    model = build_qwen35_moe_vlm(tok)
    save(model, out, tok, tokdir)
    fuse_experts(out, model)


def make_qwen35_moe_text(out, tok, tokdir):
    vlm = build_qwen35_moe_vlm(tok)
    cfg = Qwen3_5MoeTextConfig(**vlm.config.text_config.to_dict())
    cfg.architectures = ["Qwen3_5MoeForCausalLM"]
    model = Qwen3_5MoeForCausalLM(cfg)
    sd = {k.replace("model.language_model.", "model."): v for k, v in vlm.state_dict().items()
          if not k.startswith("model.visual.")}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    save(model, out, tok, tokdir)


# ---------------------------------------------------------------------------------------------
# DFlash drafters (z-lab format: fc, hidden_norm, layers.{i}.*, norm; no embedding / lm_head)

# ---------------------------------------------------------------------------------------------
# Fine-grained FP8 targets: a BF16 fixture written as above, then converted by tools/make_fp8.py
# (128 x 128 blocks, BF16 weight_scale_inv, the released layout)

def fp8_of(make_src, out, tok, tokdir):
    src = out + ".bf16-src"
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    make_src(src, tok, tokdir)
    make_fp8.convert(src, out)
    shutil.rmtree(src)


def make_qwen3_fp8(out, tok, tokdir):
    fp8_of(make_qwen3_bf16, out, tok, tokdir)


def make_qwen35_fp8(out, tok, tokdir):
    fp8_of(make_qwen35_bf16, out, tok, tokdir)


def drafter_config(tok, **kw):
    return Qwen3Config(architectures=["DFlashDraftModel"], vocab_size=VOCAB, max_position_embeddings=4096,
                       rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       tie_word_embeddings=False, **special_ids(tok), **kw)


def save_drafter(cfg, seed, out, tok, tokdir):
    torch.manual_seed(seed)
    model = randomize(DFlashDraftModel(cfg), seed)
    model.save_pretrained(out)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokdir, f), os.path.join(out, f))


def make_dflash_qwen3(out, tok, tokdir):
    cfg = drafter_config(tok, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, intermediate_size=128, block_size=8,
                         num_target_layers=4,
                         dflash_config={"mask_token_id": tok["<|mask|>"], "target_layer_ids": [0, 2]})
    save_drafter(cfg, 8, out, tok, tokdir)


def make_dflash_qwen35(out, tok, tokdir):
    cfg = drafter_config(tok, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, intermediate_size=256, block_size=16,
                         num_target_layers=8, use_sliding_window=True, sliding_window=4,
                         max_window_layers=3,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                         dflash_config={"mask_token_id": tok["<|mask|>"]})
    save_drafter(cfg, 9, out, tok, tokdir)


def make_dflash_qwen35_moe(out, tok, tokdir):
    cfg = drafter_config(tok, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, intermediate_size=128, block_size=16,
                         num_target_layers=4, use_sliding_window=True, sliding_window=4, max_window_layers=2,
                         layer_types=["sliding_attention", "full_attention"],
                         dflash_config={"mask_token_id": tok["<|mask|>"], "target_layer_ids": [0, 2]})
    save_drafter(cfg, 14, out, tok, tokdir)


def make_dflash_qwen3_sliding(out, tok, tokdir):
    """S, F, S with a window (10) above the block (8) and below the test prompts' context: the
    block attention semantics (docs/design.md §4) give different drafts here."""
    cfg = drafter_config(tok, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, intermediate_size=128, block_size=8,
                         num_target_layers=4, use_sliding_window=True, sliding_window=10, max_window_layers=3,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         dflash_config={"mask_token_id": tok["<|mask|>"], "target_layer_ids": [0, 1, 2]})
    save_drafter(cfg, 16, out, tok, tokdir)


def make_dflash_qwen3_toplevel(out, tok, tokdir):
    cfg = drafter_config(tok, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, intermediate_size=128, block_size=8,
                         num_target_layers=4, mask_token_id=tok["<|mask|>"], target_layer_ids=[0, 2])
    save_drafter(cfg, 10, out, tok, tokdir)

    def older_format(c):  # older files: no dflash_config, rope_theta at top level
        assert "dflash_config" not in c and c["target_layer_ids"] == [0, 2]
        c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
    edit_config(out, older_format)


# ---------------------------------------------------------------------------------------------
# DFlash2 drafters: written with tools/reference/dflash2_reference.py's model class (no released
# Python class runs on a CPU) in the released tensor layout (docs/dflash2.md).

def save_dflash2(cfg, seed, out, tok, tokdir):
    torch.manual_seed(seed)
    model = randomize(DFlash2DraftModel(cfg), seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            g = _gen(seed, name)
            if name.endswith("base_kernel"):  # tap 0 near identity, the others small
                _normal(p, g, 0.2)
                p[:, 0] += 1.0
            elif name.endswith("kernel_projection.weight"):
                _normal(p, g, 0.3 / p.shape[1] ** 0.5)
            elif name.endswith("_codebook"):  # edge terms comparable to the logits' spread
                _normal(p, g, 0.5)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokdir, f), os.path.join(out, f))


def dflash2_config(tok, **kw):
    return {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "vocab_size": VOCAB,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "tie_word_embeddings": False,
            "dtype": "float32", "is_causal": False, **special_ids(tok), **kw}


def make_dflash2_qwen3(out, tok, tokdir):
    """z-lab schema (dflash_config), one sliding and one full layer, both bidirectional in the block."""
    cfg = dflash2_config(tok, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, intermediate_size=128, block_size=8, num_target_layers=4,
                         layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                         dflash_config={"mask_token_id": tok["<|mask|>"], "target_layer_ids": [0, 2],
                                        "block_size": 8, "conv_kernel_size": 2, "conv_group_size": 16,
                                        "selector_rank": 16, "selector_top_k": 8})
    save_dflash2(cfg, 21, out, tok, tokdir)


def make_dflash2_qwen35(out, tok, tokdir):
    """speculators schema (fields at the top level), 3 taps, output multiplier and softcap."""
    cfg = dflash2_config(tok, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, intermediate_size=256, block_size=16, num_target_layers=8,
                         layer_types=["full_attention", "full_attention"], speculators_model_type="dflash2",
                         mask_token_id=tok["<|mask|>"], target_layer_ids=[1, 4, 6], conv_kernel_size=3,
                         conv_group_size=32, selector_rank=16, selector_top_k=6, output_multiplier=0.8,
                         final_logit_softcapping=20.0)
    save_dflash2(cfg, 22, out, tok, tokdir)


FIXTURES = {
    "qwen3_tiny": make_qwen3_tiny,
    "qwen3_bf16": make_qwen3_bf16,
    "qwen35_vlm": make_qwen35_vlm,
    "qwen35_mtp": make_qwen35_mtp,
    "qwen35_text": make_qwen35_text,
    "qwen35_bf16": make_qwen35_bf16,
    "qwen35_r1": make_qwen35_r1,
    "qwen35_sharded": make_qwen35_sharded,
    "qwen3_moe": make_qwen3_moe,
    "qwen3_moe_fused": make_qwen3_moe_fused,
    "qwen3_moe_bf16": make_qwen3_moe_bf16,
    "qwen35_moe_vlm": make_qwen35_moe_vlm,
    "qwen35_moe_text": make_qwen35_moe_text,
    "qwen35_moe_mtp": make_qwen35_moe_mtp,
    "qwen35_moe_fused": make_qwen35_moe_fused,
    "qwen3_fp8": make_qwen3_fp8,
    "qwen35_fp8": make_qwen35_fp8,
    "dflash_qwen3": make_dflash_qwen3,
    "dflash_qwen35": make_dflash_qwen35,
    "dflash_qwen3_toplevel": make_dflash_qwen3_toplevel,
    "dflash_qwen3_sliding": make_dflash_qwen3_sliding,
    "dflash_qwen35_moe": make_dflash_qwen35_moe,
    "dflash2_qwen3": make_dflash2_qwen3,
    "dflash2_qwen35": make_dflash2_qwen35,
}


def stamp_ok(d, digest):
    try:
        with open(os.path.join(d, STAMP)) as f:
            stamp = json.load(f)
        return stamp.get("hash") == digest and all(os.path.exists(os.path.join(d, x)) for x in stamp["files"])
    except (OSError, ValueError, KeyError):
        return False


def write_stamp(d, name, digest):
    files = sorted(os.listdir(d))
    with open(os.path.join(d, STAMP), "w") as f:
        json.dump({"fixture": name, "hash": digest, "files": files}, f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--force", action="store_true", help="regenerate even if stamped")
    ap.add_argument("--only", nargs="+", choices=list(FIXTURES), help="just these fixtures")
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    hf_logging.disable_progress_bar()
    digest = script_hash()
    names = args.only or list(FIXTURES)
    todo = [n for n in names if args.force or not stamp_ok(os.path.join(args.outdir, n), digest)]
    if not todo:
        print(f"fixtures up to date in {args.outdir}")
        return
    t0 = time.time()
    tokdir = os.path.join(args.outdir, "_tokenizer")
    if args.force or not stamp_ok(tokdir, digest):
        shutil.rmtree(tokdir, ignore_errors=True)
        fixture_tokenizer.write(tokdir)
        write_stamp(tokdir, "_tokenizer", digest)
    with open(os.path.join(tokdir, "tokenizer.json")) as f:
        tok = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
    for name in todo:
        d = os.path.join(args.outdir, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        t1 = time.time()
        FIXTURES[name](d, tok, tokdir)
        write_stamp(d, name, digest)
        print(f"{name}: {time.time() - t1:.1f}s")
    print(f"wrote {len(todo)} fixture(s) to {args.outdir} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
