"""Sanity checks of the generated test checkpoints (tools/make_fixtures.py) in transformers/dflash.

Env: DFL_FIXTURES = fixture directory (default build/fixtures). Missing or stale fixtures are
(re)generated first. Prints "N passed, M failed"; exits non-zero on any failure.
"""
import json
import os
import subprocess
import sys
import traceback

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer
from transformers.utils import logging as hf_logging

from dflash.model import DFlashDraftModel, dflash_generate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.environ.get("DFL_FIXTURES") or os.path.join(ROOT, "build", "fixtures")
TARGETS = ["qwen3_tiny", "qwen3_bf16", "qwen35_vlm", "qwen35_text", "qwen35_bf16", "qwen35_r1", "qwen35_sharded",
           "qwen35_mtp", "qwen3_moe", "qwen3_moe_fused", "qwen3_moe_bf16", "qwen35_moe_vlm", "qwen35_moe_text",
           "qwen35_moe_fused", "qwen35_moe_mtp"]
DRAFTERS = ["dflash_qwen3", "dflash_qwen35", "dflash_qwen3_toplevel", "dflash_qwen35_moe", "dflash_qwen3_sliding"]
IDS = torch.tensor([[997, 348, 266, 198, 45, 288, 282, 741, 645, 220, 19, 23, 14, 17, 279, 998, 5, 700]])

hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()
torch.set_num_threads(2)
TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def path(name, *rest):
    return os.path.join(FIX, name, *rest)


def config(name):
    with open(path(name, "config.json")) as f:
        return json.load(f)


def tensors(name):
    """{tensor name: (dtype, shape)} over model.safetensors or all shards."""
    index = path(name, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(path(name, fn), "pt") as f:
            for k in f.keys():
                s = f.get_slice(k)
                assert k not in out, f"{k} in two shards"
                out[k] = (s.get_dtype(), s.get_shape())
    return out


def load(name, cls=AutoModelForCausalLM, **kw):
    model, info = cls.from_pretrained(path(name), dtype=torch.float32, attn_implementation="eager",
                                      output_loading_info=True, **kw)
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["error_msgs"], (name, info)
    return model.eval()


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits[0]


@test
def files_present():
    for name in TARGETS + DRAFTERS:
        need = ["config.json", "tokenizer.json", "tokenizer_config.json", "fixture.stamp"]
        need += ["generation_config.json"] if name in TARGETS else []
        for f in need:
            assert os.path.exists(path(name, f)), f"{name}/{f} missing"
        assert tensors(name)


@test
def tokenizer():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path("qwen3_tiny", "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]}
    assert list(ids.values()) == [996, 997, 998, 999], ids
    assert tok.get_vocab_size() == 1000
    text = "<|im_start|>user\nNatalia sold 48/2 = 24 clips in May.<|im_end|>"
    auto = AutoTokenizer.from_pretrained(path("qwen3_tiny"))
    assert auto(text)["input_ids"] == tok.encode(text).ids
    assert auto.eos_token_id == 998 and tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    with open(path("qwen3_tiny", "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == [998, 996]
    for name in TARGETS + DRAFTERS:  # same tokenizer everywhere, vocab fits the model
        with open(path(name, "tokenizer.json")) as a, open(path("qwen3_tiny", "tokenizer.json")) as b:
            assert a.read() == b.read(), name
        c = config(name)
        assert c.get("text_config", c)["vocab_size"] >= 1000


@test
def targets_load_and_run():
    for name in TARGETS:
        out = logits(load(name))
        assert out.shape == (IDS.shape[1], 1024) and torch.isfinite(out).all(), name
        assert len(set(out.argmax(-1).tolist())) > 3, f"{name}: degenerate argmax"


@test
def qwen3_layouts():
    t = tensors("qwen3_tiny")
    assert "lm_head.weight" not in t and t["model.embed_tokens.weight"] == ("F32", [1024, 64])
    assert t["model.layers.0.self_attn.q_proj.weight"] == ("F32", [128, 64])
    t = tensors("qwen3_bf16")
    assert all(d == "BF16" for d, _ in t.values())
    assert t["lm_head.weight"] == ("BF16", [1024, 96])
    assert t["model.layers.4.self_attn.q_proj.weight"][1] == [192, 96]
    assert t["model.layers.4.self_attn.o_proj.weight"][1] == [96, 192]
    assert config("qwen3_bf16")["tie_word_embeddings"] is False


@test
def vlm_layout():
    t = tensors("qwen35_vlm")
    assert any(k.startswith("model.visual.") for k in t)
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
            "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= set(t)
    text = [k for k in t if k.startswith("model.language_model.")]
    assert "model.language_model.embed_tokens.weight" in text and "model.language_model.norm.weight" in text
    assert not any(k.startswith("model.layers.") for k in t) and "lm_head.weight" not in t
    assert t["model.language_model.layers.3.self_attn.q_proj.weight"][1] == [512, 128]  # query + gate
    assert t["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"][1] == [256, 128]
    c = config("qwen35_vlm")
    assert c["model_type"] == "qwen3_5" and c["text_config"]["layer_types"] == (["linear_attention"] * 3
                                                                                + ["full_attention"]) * 2
    tt = tensors("qwen35_text")
    assert sorted(k.replace("model.language_model.", "model.") for k in text) == sorted(tt)
    assert config("qwen35_text")["model_type"] == "qwen3_5_text"
    b = tensors("qwen35_bf16")
    assert all(d == "BF16" for d, _ in b.values()) and "lm_head.weight" in b and any(k.startswith("mtp.") for k in b)
    assert "layer_types" not in config("qwen35_bf16")["text_config"]
    assert load("qwen35_bf16").config.layer_types == ["linear_attention", "linear_attention", "full_attention"] * 2
    r1 = tensors("qwen35_r1")
    assert r1["model.layers.0.linear_attn.in_proj_qkv.weight"][1] == [2 * 2 * 32 + 2 * 32, 64]
    assert "lm_head.weight" in r1


@test
def mtp_layout():
    """mtp.* as released Qwen3.5 checkpoints name and shape them (15 tensors, one layer), with
    mtp_num_hidden_layers in text_config; qwen35_mtp is qwen35_vlm with another head."""
    for name, H, I, Hq, Hkv, hd in [("qwen35_vlm", 128, 256, 4, 2, 64), ("qwen35_bf16", 96, 192, 3, 1, 32),
                                    ("qwen35_mtp", 128, 256, 4, 2, 64)]:
        t = {k: s for k, (_, s) in tensors(name).items() if k.startswith("mtp.")}
        want = {"mtp.fc.weight": [H, 2 * H], "mtp.pre_fc_norm_embedding.weight": [H],
                "mtp.pre_fc_norm_hidden.weight": [H], "mtp.norm.weight": [H]}
        L = "mtp.layers.0."
        want.update({L + "input_layernorm.weight": [H], L + "post_attention_layernorm.weight": [H],
                     L + "self_attn.q_proj.weight": [Hq * hd * 2, H], L + "self_attn.k_proj.weight": [Hkv * hd, H],
                     L + "self_attn.v_proj.weight": [Hkv * hd, H], L + "self_attn.o_proj.weight": [H, Hq * hd],
                     L + "self_attn.q_norm.weight": [hd], L + "self_attn.k_norm.weight": [hd],
                     L + "mlp.gate_proj.weight": [I, H], L + "mlp.up_proj.weight": [I, H],
                     L + "mlp.down_proj.weight": [H, I]})
        assert t == want, (name, sorted(set(t) ^ set(want)))
        assert config(name)["text_config"]["mtp_num_hidden_layers"] == 1, name
    a, b = load_file(path("qwen35_vlm", "model.safetensors")), load_file(path("qwen35_mtp", "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a if not k.startswith("mtp."))
    assert not torch.equal(a["mtp.fc.weight"], b["mtp.fc.weight"])  # the fitted head


@test
def moe_mtp_layout():
    """qwen35_moe_mtp is qwen35_moe_vlm with an MTP head whose MLP is the released Qwen3.5-MoE
    block (router, fused experts, shared expert and its gate): 19 tensors."""
    H, E, Ie, Is, Hq, Hkv, hd = 64, 8, 32, 48, 2, 1, 32
    t = {k: s for k, (_, s) in tensors("qwen35_moe_mtp").items() if k.startswith("mtp.")}
    L = "mtp.layers.0."
    want = {"mtp.fc.weight": [H, 2 * H], "mtp.pre_fc_norm_embedding.weight": [H], "mtp.pre_fc_norm_hidden.weight": [H],
            "mtp.norm.weight": [H], L + "input_layernorm.weight": [H], L + "post_attention_layernorm.weight": [H],
            L + "self_attn.q_proj.weight": [Hq * hd * 2, H], L + "self_attn.k_proj.weight": [Hkv * hd, H],
            L + "self_attn.v_proj.weight": [Hkv * hd, H], L + "self_attn.o_proj.weight": [H, Hq * hd],
            L + "self_attn.q_norm.weight": [hd], L + "self_attn.k_norm.weight": [hd], L + "mlp.gate.weight": [E, H],
            L + "mlp.experts.gate_up_proj": [E, 2 * Ie, H], L + "mlp.experts.down_proj": [E, H, Ie],
            L + "mlp.shared_expert.gate_proj.weight": [Is, H], L + "mlp.shared_expert.up_proj.weight": [Is, H],
            L + "mlp.shared_expert.down_proj.weight": [H, Is], L + "mlp.shared_expert_gate.weight": [1, H]}
    assert t == want, sorted(set(t) ^ set(want))
    assert config("qwen35_moe_mtp")["text_config"]["mtp_num_hidden_layers"] == 1
    a = load_file(path("qwen35_moe_vlm", "model.safetensors"))
    b = load_file(path("qwen35_moe_mtp", "model.safetensors"))
    assert set(b) - set(a) == set(t) and all(torch.equal(a[k], b[k]) for k in a)


@test
def vlm_and_text_layouts_agree():
    ref = logits(load("qwen35_text"))
    for name in ["qwen35_vlm", "qwen35_sharded"]:
        assert torch.equal(logits(load(name)), ref), name
    vlm = load("qwen35_vlm", AutoModelForImageTextToText)
    assert type(vlm).__name__ == "Qwen3_5ForConditionalGeneration"
    assert torch.allclose(logits(vlm), ref, atol=1e-5, rtol=0), (logits(vlm) - ref).abs().max()


@test
def moe_layouts():
    """save_pretrained writes the experts per expert; the *_fused copies hold transformers' fused
    parameters instead, load to the same model, and route tokens over several experts."""
    t = tensors("qwen3_moe")
    assert t["model.layers.0.mlp.gate.weight"] == ("F32", [8, 64])
    assert t["model.layers.0.mlp.experts.7.gate_proj.weight"] == ("F32", [32, 64])
    assert t["model.layers.0.mlp.experts.7.down_proj.weight"] == ("F32", [64, 32])
    assert t["model.layers.2.mlp.gate_proj.weight"] == ("F32", [128, 64])  # mlp_only_layers [2]
    assert not any(".mlp.experts.gate_up_proj" in k for k in t)
    f = tensors("qwen3_moe_fused")
    assert f["model.layers.0.mlp.experts.gate_up_proj"] == ("F32", [8, 64, 64])
    assert f["model.layers.0.mlp.experts.down_proj"] == ("F32", [8, 64, 32])
    assert not any(".mlp.experts.0." in k for k in f)
    v = tensors("qwen35_moe_vlm")
    assert v["model.language_model.layers.3.mlp.shared_expert_gate.weight"] == ("F32", [1, 64])
    assert v["model.language_model.layers.3.mlp.shared_expert.up_proj.weight"] == ("F32", [48, 64])
    assert v["model.language_model.layers.0.mlp.experts.0.up_proj.weight"] == ("F32", [32, 64])
    assert tensors("qwen35_moe_fused")["model.language_model.layers.1.mlp.experts.gate_up_proj"] == ("F32", [8, 64, 64])
    assert config("qwen35_moe_vlm")["model_type"] == "qwen3_5_moe"
    assert config("qwen35_moe_text")["model_type"] == "qwen3_5_moe_text"
    assert config("qwen3_moe_bf16")["decoder_sparse_step"] == 2 and not config("qwen3_moe_bf16")["norm_topk_prob"]
    # same parameters once loaded (logits may differ in the last bits: transformers merges the
    # per-expert tensors on load into differently laid out memory than a fused file gives)
    for a, b in (("qwen3_moe", "qwen3_moe_fused"), ("qwen35_moe_text", "qwen35_moe_vlm"),
                 ("qwen35_moe_vlm", "qwen35_moe_fused")):
        sa, sb = load(a).state_dict(), load(b).state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), (a, b)
    model = load("qwen35_moe_text")
    with torch.no_grad():
        x = model.model.embed_tokens(IDS)
        top = model.model.layers[0].mlp.gate(x[0])[2]  # (logits, weights, expert indices)
    assert len(set(top.flatten().tolist())) >= 6, f"routing collapsed onto {set(top.flatten().tolist())}"


@test
def sharded():
    with open(path("qwen35_sharded", "model.safetensors.index.json")) as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) >= 3, shards
    assert not os.path.exists(path("qwen35_sharded", "model.safetensors"))


@test
def drafters():
    expect = {"dflash_qwen3": ([0, 2], 8, 64, 2), "dflash_qwen3_toplevel": ([0, 2], 8, 64, 2),
              "dflash_qwen35": ([1, 3, 5], 16, 128, 3), "dflash_qwen35_moe": ([0, 2], 16, 64, 2),
              "dflash_qwen3_sliding": ([0, 1, 2], 8, 64, 3)}
    for name, (ids, block, H, L) in expect.items():
        model = load(name, DFlashDraftModel)
        assert list(model.target_layer_ids) == ids and model.block_size == block and model.mask_token_id == 999
        t = tensors(name)
        assert t["fc.weight"] == ("F32", [H, len(ids) * H]) and "hidden_norm.weight" in t and "norm.weight" in t
        assert not any("embed" in k or "lm_head" in k for k in t)
        assert {k.split(".")[1] for k in t if k.startswith("layers.")} == {str(i) for i in range(L)}
    assert "dflash_config" not in config("dflash_qwen3_toplevel") and config("dflash_qwen3_toplevel")["mask_token_id"] == 999
    assert "target_layer_ids" not in config("dflash_qwen35")["dflash_config"]
    assert config("dflash_qwen35")["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    c = config("dflash_qwen3_sliding")  # window above the block, no is_causal: the default semantics
    assert c["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"] and \
        c["sliding_window"] == 10 and "is_causal" not in c and "causal" not in c["dflash_config"]


def oracle_drafter(drafter, truth, seed):
    """Make the drafter propose the true greedy tokens for a random number of block positions,
    then wrong ones, so verification accepts partial blocks (random drafters accept nothing)."""
    g = torch.Generator().manual_seed(seed)
    where = {}
    drafter.register_forward_hook(lambda _m, _a, kw, out: where.update(start=int(kw["position_ids"][0, -out.shape[1]])),
                                  with_kwargs=True)

    def compute_logits(hidden, _head):
        n = hidden.shape[1]
        good = int(torch.randint(0, n + 1, (1,), generator=g))
        want = truth[where["start"] + 1:where["start"] + 1 + n].clone()
        want[good:] = (want[good:] + 1) % 1024
        return torch.nn.functional.one_hot(want, 1024).float()[None] * 10

    drafter.compute_logits = compute_logits


@test
def dflash_is_lossless():
    """The reference itself: dflash_generate equals plain greedy decoding, with random drafters
    (nothing accepted) and with oracle drafters (partial blocks accepted). Hybrid targets need
    dflash_ref's exact rollback (transformers' crop leaves a linear layer's recurrent state stale)."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
    from dflash_ref import ExactRollback
    n = 40
    for target, drafter in [("qwen3_tiny", "dflash_qwen3"), ("qwen35_vlm", "dflash_qwen35")]:
        t = load(target)
        with torch.no_grad():
            plain = t.generate(IDS, do_sample=False, max_new_tokens=n + 20, eos_token_id=None, pad_token_id=0)[0]
        for oracle in (False, True):
            d = load(drafter, DFlashDraftModel)
            if oracle:
                oracle_drafter(d, plain, 1)
            fix = ExactRollback(t)
            try:
                res = dflash_generate(d, t, IDS, n, None, return_stats=True)
            finally:
                fix.close()
            spec = res.output_ids[0, IDS.shape[1]:]
            assert torch.equal(spec, plain[IDS.shape[1]:IDS.shape[1] + n]), (target, oracle, spec.tolist())
            if oracle:
                assert len(set(res.acceptance_lengths)) > 2, res.acceptance_lengths


def main():
    gen = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_fixtures.py"), FIX],
                         capture_output=True, text=True)
    if gen.returncode != 0:
        print(gen.stdout, gen.stderr)
        print("0 passed, 1 failed (make_fixtures.py)")
        sys.exit(1)
    passed = failed = 0
    for fn in TESTS:
        try:
            fn()
            passed += 1
            print(f"PASS {fn.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL {fn.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
