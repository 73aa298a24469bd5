"""Reference drafts of a Qwen3.5/3.6 checkpoint's MTP head (`mtp.*`), minimal PyTorch (CPU, float32).

    python tools/reference/mtp_reference.py --target DIR --ids PROMPT_IDS --tokens GENERATED_IDS \
        --starts S1,S2,... --steps K1,K2,... --out REF.safetensors

Written from vLLM's Qwen3_5MultiTokenPredictor (vllm/model_executor/models/qwen3_5_mtp.py) and the
EAGLE/MTP proposer that drives it (vllm/v1/spec_decode/eagle.py); SGLang's Qwen3_5ForCausalLMMTP
(python/sglang/srt/models/qwen3_5_mtp.py) builds the same module. transformers has no MTP module,
so its Qwen3.5 decoder layer and zero-centred RMSNorm are reused for the parts they share (on a
Qwen3.5-MoE checkpoint its Qwen3_5Moe decoder layer, whose MLP is the sparse MoE block: vLLM's
Qwen3_5DecoderLayer builds a Qwen3NextSparseMoeBlock for qwen3_5_moe_text, in the MTP layer too):
  - the target's hidden state h_i is its output after the final norm (what vLLM's model returns and
    its lm_head reads: transformers' last hidden_states entry);
  - the MTP input at position i is (h_i, x_{i+1}): u = fc(cat[pre_fc_norm_embedding(embed(x_{i+1})),
    pre_fc_norm_hidden(h_i)]), then mtp.layers.0 (a gated full-attention Qwen3.5 layer, causal over
    the MTP's positions, RoPE at position i), then mtp.norm; logits = the target's lm_head;
  - step 1 of a round whose anchor sits at position s reads the pairs of positions 0..s-1 (the last
    one pairs h_{s-1} with the anchor x_s); step k+1 appends (y_k, argmax of step k) at position
    s-1+k, y_k being step k's output after mtp.norm (vLLM's method "mtp" feeds it back as is).
Every step recomputes the MTP over the whole sequence (no cache): the cache dfl keeps must give
the same numbers.

Writes draft_logits.{r} F32 [K_r, V] and draft_ids.{r} I64 [K_r] (the argmax path) per round r.
`fit_mtp` (used by tools/make_fixtures.py) trains an MTP head on a target's own greedy text."""
import argparse
import copy
import glob
import json
import os
import re

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_5.modeling_qwen3_5 import (Qwen3_5DecoderLayer, Qwen3_5RMSNorm,
                                                           Qwen3_5TextRotaryEmbedding)
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm,
                                                                   Qwen3_5MoeTextRotaryEmbedding)
from transformers.utils import logging as hf_logging


class MTPHead(nn.Module):
    """mtp.* of a Qwen3.5 checkpoint: state-dict keys are the tensor names without 'mtp.'."""

    def __init__(self, text_config):
        super().__init__()
        c = copy.deepcopy(text_config)
        c.num_hidden_layers, c.layer_types = 1, ["full_attention"]
        c._attn_implementation = "eager"
        H, eps = c.hidden_size, c.rms_norm_eps
        moe = getattr(c, "num_experts", 0) > 0
        Norm, Layer = (Qwen3_5MoeRMSNorm, Qwen3_5MoeDecoderLayer) if moe else (Qwen3_5RMSNorm, Qwen3_5DecoderLayer)
        self.pre_fc_norm_embedding = Norm(H, eps=eps)
        self.pre_fc_norm_hidden = Norm(H, eps=eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([Layer(c, 0)])
        self.norm = Norm(H, eps=eps)
        self.rotary = (Qwen3_5MoeTextRotaryEmbedding if moe else Qwen3_5TextRotaryEmbedding)(c)

    def forward(self, emb, hid):
        """emb, hid [T, H] (embeddings of x_{i+1}, final-normed h_i) at positions 0..T-1 -> [T, H]."""
        T = emb.shape[0]
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hid)], -1))[None]
        pe = self.rotary(u, torch.arange(T)[None])
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        return self.norm(self.layers[0](u, position_embeddings=pe, attention_mask=mask))[0]


def load_target(target):
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32, attn_implementation="eager").eval()
    return model


def fuse_experts(tensors, E):
    """Per-expert MoE tensors (mlp.experts.{e}.{gate,up,down}_proj.weight) as the fused parameters
    of transformers' experts module (gate_up_proj [E, 2I, H], down_proj [E, H, I])."""
    pre = "layers.0.mlp.experts."
    if f"{pre}0.gate_proj.weight" not in tensors:
        return tensors
    g = [tensors.pop(f"{pre}{e}.gate_proj.weight") for e in range(E)]
    u = [tensors.pop(f"{pre}{e}.up_proj.weight") for e in range(E)]
    d = [tensors.pop(f"{pre}{e}.down_proj.weight") for e in range(E)]
    tensors[pre + "gate_up_proj"] = torch.stack([torch.cat([a, b]) for a, b in zip(g, u)])
    tensors[pre + "down_proj"] = torch.stack(d)
    return tensors


def load_mtp(target, model):
    tensors = {}
    for f in sorted(glob.glob(os.path.join(target, "*.safetensors"))):
        tensors.update({k[len("mtp."):]: v.float() for k, v in load_file(f).items() if k.startswith("mtp.")})
    if not tensors:
        raise SystemExit(f"{target}: no mtp.* tensors")
    tensors = fuse_experts(tensors, getattr(model.config.get_text_config(), "num_experts", 0))
    head = MTPHead(model.config.get_text_config())
    head.load_state_dict(tensors, strict=True)  # every mtp.* tensor, none missing
    return head.eval()


def target_hidden(model, seq):
    """Final-normed hidden states [T, H] of seq (transformers' last hidden_states entry)."""
    with torch.no_grad():
        out = model(torch.tensor([seq]), output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1][0].float()


def draft(model, head, hid, seq, s, steps):
    """Draft `steps` tokens for the round whose anchor is seq[s]: ([steps, V] logits, argmax ids)."""
    emb, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    hs, xs, rows, ids = [hid[i] for i in range(s)], list(seq[1:s + 1]), [], []
    with torch.no_grad():
        for _ in range(steps):
            y = head(emb(torch.tensor(xs)).float(), torch.stack(hs))[-1]
            logits = lm_head(y[None])[0].float()
            rows.append(logits)
            ids.append(int(torch.argmax(logits)))
            hs.append(y)
            xs.append(ids[-1])
    return torch.stack(rows), ids


def fit_mtp(model, mtp_tensors, prompts, n_new, steps, lr, seed):
    """Train mtp.* tensors (dict name -> tensor, updated in place) to predict x_{i+2} from (h_i,
    x_{i+1}) on the target's own greedy continuations of prompts (teacher forcing, as MTP heads are
    trained): gives a fixture head whose drafts get accepted."""
    torch.manual_seed(seed)
    head = MTPHead(model.config.get_text_config())
    head.load_state_dict({k[len("mtp."):]: v.float() for k, v in mtp_tensors.items()}, strict=True)
    emb = model.get_input_embeddings()
    data = []
    with torch.no_grad():
        for p in prompts:
            seq = model.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False,
                                 min_new_tokens=n_new)[0].tolist()
            data.append((torch.tensor(seq), target_hidden(model, seq)))
    opt = torch.optim.Adam([q for n, q in head.named_parameters()], lr=lr)
    for _ in range(steps):
        loss = 0
        for seq, hid in data:
            out = head(emb(seq[1:-1]).float().detach(), hid[:-2])
            logits = model.get_output_embeddings()(out)
            loss = loss + nn.functional.cross_entropy(logits, seq[2:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    sd = head.state_dict()
    for k in mtp_tensors:
        mtp_tensors[k] = sd[k[len("mtp."):]].detach().to(mtp_tensors[k].dtype).contiguous()
    return float(loss.detach()) / len(data)


def ints(s):
    return [int(x) for x in re.split(r"[,\s]+", s.strip()) if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--ids", required=True, help="prompt ids")
    ap.add_argument("--tokens", required=True, help="the generated ids (the committed sequence after the prompt)")
    ap.add_argument("--starts", required=True, help="anchor position of each round")
    ap.add_argument("--steps", required=True, help="MTP steps of each round (block size - 1)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    hf_logging.disable_progress_bar()
    model = load_target(args.target)
    head = load_mtp(args.target, model)
    seq = ints(args.ids) + ints(args.tokens)
    starts, steps = ints(args.starts), ints(args.steps)
    hid = target_hidden(model, seq)
    out = {}
    for r, (s, k) in enumerate(zip(starts, steps)):
        logits, ids = draft(model, head, hid, seq, s, k)
        out[f"draft_logits.{r}"] = logits.contiguous()
        out[f"draft_ids.{r}"] = torch.tensor(ids, dtype=torch.long)
    save_file(out, args.out)
    print(json.dumps({"rounds": len(starts), "out": args.out}))


if __name__ == "__main__":
    main()
