"""`dfl inspect` on every fixture layout: the layout and the prefix that matched, architecture,
layer types, tensor counts per component checked against the files themselves, every unused
tensor listed, drafter target_layer_ids and their meaning, drafter/target compatibility, the
drafters a target checkpoint offers (its MTP head present, dense or MoE, absent, or present but
unusable); on
the MoE fixtures the experts, top-k, shared expert, expert layout and the total / active
parameter counts, checked against transformers' own model."""
import json
import os
import shutil
import tempfile

from safetensors import safe_open

from dfltest import Tally, dfl, dfl_json, fixture

t = Tally("inspect")


def tensor_names(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    names = []
    for f in files:
        with safe_open(os.path.join(d, f), "np") as s:
            names += list(s.keys())
    return names


def target(name, layout, prefix, arch, pattern, untied):
    j = dfl_json("inspect", fixture(name), "--json")
    names = tensor_names(fixture(name))
    vision = [n for n in names if n.startswith("model.visual.")]
    mtp = [n for n in names if n.startswith("mtp.")]
    t.check(j["layout"] == layout and j["prefix"] == prefix and j["architecture"] == arch,
            f"{name}: layout {j['layout']} prefix {j['prefix']} arch {j['architecture']}")
    t.check(j["layer_pattern"] == pattern and len(j["layer_types"]) == j["num_layers"] == len(pattern),
            f"{name}: pattern {j['layer_pattern']}")
    t.check(all(lt == ("linear_attention" if c == "L" else "full_attention") for lt, c in zip(j["layer_types"], pattern)),
            f"{name}: layer_types")
    t.check(j["n_tensors"] == len(names) and sum(j["tensors"].values()) == len(names),
            f"{name}: {j['tensors']} vs {len(names)} tensors in the files")
    t.check(j["tensors"]["vision"] == len(vision) and j["tensors"]["mtp"] == len(mtp),
            f"{name}: vision/mtp counts {j['tensors']}")
    t.check(sorted(j["unused"]["vision"]) == sorted(vision) and sorted(j["unused"]["mtp"]) == sorted(mtp) and
            j["unused"]["text"] == [] and j["unused"]["other"] == [], f"{name}: unused lists {j['unused']}")
    t.check(j["tie_word_embeddings"] != untied, f"{name}: tie_word_embeddings")
    t.check(j["bytes"] == sum(j["tensor_bytes"].values()) and j["used_bytes"] <= j["bytes"], f"{name}: bytes")
    text = dfl("inspect", fixture(name)).stdout
    t.check(f"layout:       {layout}" in text and prefix in text and pattern in text, f"{name}: text report")
    # the MTP head: offered as a drafter exactly when the checkpoint carries mtp.* tensors
    t.check(j["mtp"]["tensors"] == len(mtp) and j["mtp"]["usable"] == bool(mtp) and
            j["drafters"] == (["mtp"] if mtp else []), f"{name}: drafters {j['drafters']} mtp {j['mtp']}")
    want = (f"drafters:     mtp — the checkpoint's own MTP head (1 layer, {len(mtp)} mtp.* tensors): --drafter mtp"
            if mtp else "drafters:     none — no MTP head (no mtp.* tensors)")
    t.check(want in text, f"{name}: drafters line in the text report")


def mtp_unusable():
    """mtp.* tensors the head cannot run: the report says why, and offers no drafter."""
    d = os.path.join(tempfile.mkdtemp(prefix="dfl-inspect-"), "two_mtp_layers")
    shutil.copytree(fixture("qwen35_vlm"), d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["text_config"]["mtp_num_hidden_layers"] = 2
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    j = dfl_json("inspect", d, "--json")
    t.check(j["mtp"]["tensors"] == 15 and not j["mtp"]["usable"] and j["drafters"] == [] and
            "mtp_num_hidden_layers is 2" in j["mtp"]["error"], f"two MTP layers: {j['mtp']}")
    t.check("drafters:     none — 15 mtp.* tensors, but no usable MTP head" in dfl("inspect", d).stdout,
            "two MTP layers: text report")


def drafters():
    j = dfl_json("inspect", fixture("dflash_qwen35"), "--json")
    t.check(j["layout"] == "drafter" and j["layer_pattern"] == "SSF" and j["sliding_window"] == 4 and
            j["block_size"] == 16 and j["mask_token_id"] == 999, f"dflash_qwen35: {j}")
    t.check(j["target_layer_ids"] == [1, 3, 5] and j["target_layer_ids_source"] == "default formula" and
            j["hidden_states_indices"] == [2, 4, 6], f"default ids: {j['target_layer_ids']}")
    j = dfl_json("inspect", fixture("dflash_qwen3"), "--target", fixture("qwen3_tiny"), "--json")
    t.check(j["compatible"] and j["target_layer_ids"] == [0, 2] and j["target_layer_ids_source"] == "config",
            f"dflash_qwen3 fit: {j}")
    j = dfl_json("inspect", fixture("dflash_qwen3_toplevel"), "--target", fixture("qwen3_tiny"), "--json")
    t.check(j["compatible"] and j["target_layer_ids"] == [0, 2] and j["block_size"] == 8, f"top-level: {j}")
    p = dfl("inspect", fixture("dflash_qwen3"), "--target", fixture("qwen35_vlm"), "--json", check=False)
    j = json.loads(p.stdout)
    t.check(p.returncode == 1 and not j["compatible"] and "hidden_size 64 != target hidden_size 128" in
            j["incompatibility"], f"misfit: {j}")
    text = dfl("inspect", fixture("dflash_qwen35"), "--target", fixture("qwen35_vlm")).stdout
    t.check("compatible" in text and "hidden_states[2, 4, 6]" in text, f"drafter text report: {text}")


t.run(target, "qwen3_tiny", "text", "model.", "qwen3", "FFFF", False)
t.run(target, "qwen3_bf16", "text", "model.", "qwen3", "FFFFF", True)
t.run(target, "qwen35_vlm", "vlm", "model.language_model.", "qwen3_5", "LLLFLLLF", False)
t.run(target, "qwen35_text", "text", "model.", "qwen3_5", "LLLFLLLF", False)
t.run(target, "qwen35_bf16", "vlm", "model.language_model.", "qwen3_5", "LLFLLF", True)
t.run(target, "qwen35_r1", "text", "model.", "qwen3_5", "LLLF", True)
t.run(target, "qwen35_sharded", "text", "model.", "qwen3_5", "LLLFLLLF", False)
t.run(target, "qwen3_moe", "text", "model.", "qwen3", "FFFF", False)
t.run(target, "qwen3_moe_fused", "text", "model.", "qwen3", "FFFF", False)
t.run(target, "qwen35_moe_vlm", "vlm", "model.language_model.", "qwen3_5", "LLLF", False)
t.run(target, "qwen35_moe_text", "text", "model.", "qwen3_5", "LLLF", False)
t.run(target, "qwen35_moe_fused", "vlm", "model.language_model.", "qwen3_5", "LLLF", False)
t.run(target, "qwen35_moe_mtp", "vlm", "model.language_model.", "qwen3_5", "LLLF", False)  # an MoE MTP head
t.run(drafters)
t.run(mtp_unusable)


def moe(name, experts, k, shared, sparse, layout, norm):
    """The MoE summary, and parameter counts equal to transformers': total = the text model's
    parameters (a tied lm_head once), active = total minus the E - k routed experts a token skips."""
    import torch
    from transformers import AutoModelForCausalLM
    j = dfl_json("inspect", fixture(name), "--json")
    m = j["moe"]
    t.check(m is not None and m["experts"] == experts and m["experts_per_tok"] == k and m["shared_expert"] == shared
            and m["sparse_layers"] == sparse and m["expert_layout"] == layout and m["norm_topk_prob"] == norm,
            f"{name}: moe {m}")
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(fixture(name), dtype=torch.float32)
    text = {n: p for n, p in model.named_parameters() if ".visual." not in f".{n}"}
    total = sum(p.numel() for p in text.values())
    skipped = sum(p[0].numel() * (p.shape[0] - k) for n, p in text.items()
                  if n.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")))
    t.check(j["parameters"] == {"total": total, "active": total - skipped},
            f"{name}: parameters {j['parameters']}, transformers: total {total}, active {total - skipped}")
    out = dfl("inspect", fixture(name)).stdout
    t.check(f"{experts} routed, top-{k} per token" in out and "active per token" in out, f"{name}: text report {out}")


t.run(moe, "qwen3_moe", 8, 2, False, 3, "per_expert", True)
t.run(moe, "qwen3_moe_fused", 8, 2, False, 3, "fused", True)
t.run(moe, "qwen3_moe_bf16", 6, 3, False, 2, "per_expert", False)
t.run(moe, "qwen35_moe_vlm", 8, 2, True, 4, "per_expert", True)
t.run(moe, "qwen35_moe_fused", 8, 2, True, 4, "fused", True)
t.run(moe, "qwen35_moe_mtp", 8, 2, True, 4, "per_expert", True)  # its MTP head's experts are not the target's
dense = dfl_json("inspect", fixture("qwen3_tiny"), "--json")
t.check(dense["moe"] is None and dense["parameters"]["total"] == dense["parameters"]["active"], f"dense: {dense}")
t.done()
