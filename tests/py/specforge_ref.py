"""A minimal reference for `dfl eval --train-metrics` (src/eval/train_metrics.c), written from the
semantics of SpecForge's DFlash-family training (specforge/algorithms/common/dflash_family_model.py:
anchor sampling, the dense block mask, accuracy and accepted length) in torch float32, with z-lab's
DFlashDraftModel as the drafter and the transformers target for the embedding, the lm_head and the
target's own distribution.

Sequence x = prompt ids (n_prompt) + label ids (n), T = n_prompt + n; the labels are the loss mask.
- anchors: p with p and p + 1 supervised, i.e. p in [n_prompt, T - 2];
- block of anchor p: [x_p, MASK x (B-1)] at positions p..p+B-1; slot k (1..B-1) predicts x_{p+k} and
  is valid iff p + k <= T - 1;
- attention, one batched forward for every anchor given: queries are the blocks, keys are [the
  target features of the context positions ; every block]; a block sees context positions < its
  anchor, all of itself (bidirectional), no other block;
- correct_k: argmax of slot k's logits == x_{p+k}; leading run a: consecutive correct valid slots
  from k = 1; simulated acceptance 1 + a;
- alpha_k = sum over the target's top-K tokens v of min(p_draft_k(v), p_target(v | x_<p+k)), the
  target's distribution from its last decoder layer's output at position p + k - 1 (final norm,
  lm_head, softmax); left_k = the target's mass outside that top-K;
- counts over a set of anchors: valid/correct per k, cont[k] (run reached k-1 and slot k valid),
  reach[k] (run reached k), len_sum = sum (1 + a), exp_len_sum = sum (1 + sum_k prod_{j<=k} alpha_j)
  over valid slots, alpha/left per k summed over valid slots;
- the serving walk: p = n_prompt, then p += a(p) + 1 while p <= T - 2; a round whose run reaches the
  last label (T - 1) ends the output, so it counts a, not 1 + a (no bonus token).

softmax="torch" is torch's float32 softmax; softmax="dfl" reproduces the training metrics' softmax
(src/eval/train_metrics.c: float32 exp, the normalizer summed in double, the quotient rounded to
float32): comparing with it isolates dfl's logic from rounding (tests/py/test_train_metrics.py does
both)."""
import numpy as np
import torch
from safetensors import safe_open

TIE = 1e-5  # logit gap under which an argmax decision counts as a near tie


def load_drafter(path):
    from dflash.model import DFlashDraftModel
    return DFlashDraftModel.from_pretrained(path, dtype=torch.float32).eval()


def load_target(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def read_features(path):
    """A `dfl eval --save-features` file: {"x": the sequence [T] (prompt + labels), "n_prompt",
    "layers": {k: float32 [T-1, H]} (feature rows: every position but the last), "meta"}."""
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        np_, n = int(meta["prompt_tokens"]), int(meta["tokens"])
        inp, truth = f.get_tensor("input_ids").long(), f.get_tensor("truth_ids").long()
        layers = {int(k.split(".")[1]): f.get_tensor(k).float() for k in f.keys() if k.startswith("layer.")}
    return {"x": torch.cat([inp[:np_], truth[:n]]), "n_prompt": np_, "layers": layers, "meta": meta}


def valid_anchors(n_prompt, T):
    """SpecForge's rule: p with loss_mask[p] and loss_mask[p+1] (loss mask = positions >= n_prompt)."""
    return list(range(n_prompt, T - 1))


def sample_anchor_positions(n_prompt, T, num_anchors, generator=None):
    """SpecForge's sampling semantics: at most num_anchors valid anchors, uniformly without
    replacement, ascending (uniform keys, invalid positions pushed last, the smallest kept)."""
    mask = torch.zeros(T)
    mask[n_prompt:] = 1
    valid = (mask[:-1] > 0.5) & (mask[1:] > 0.5)
    width = min(num_anchors, int(valid.sum()))
    r = torch.rand(valid.shape, generator=generator)
    r[~valid] = 2.0
    return sorted(r.argsort()[:width].tolist())


def block_mask(anchors, B, S):
    """Bool [N*B, S + N*B], True = may attend: SpecForge's dense DFlash mask (no sliding window)."""
    a = torch.as_tensor(anchors, dtype=torch.long)
    N = len(a)
    qb = torch.arange(N * B) // B
    kv = torch.arange(S + N * B)
    ctx = (kv[None, :] < S) & (kv[None, :] < a[qb][:, None])
    draft = (kv[None, :] >= S) & (((kv[None, :] - S) // B) == qb[:, None])
    return ctx | draft


def softmax(x, how="torch"):
    if how == "torch":
        return torch.softmax(x.float(), dim=-1)
    z = x.float().numpy()
    e = np.exp(z - z.max(-1, keepdims=True)).astype(np.float32)
    s = e.sum(-1, keepdims=True, dtype=np.float64)  # summed in double, as train_metrics.c's softmax_d
    return torch.from_numpy((e.astype(np.float64) * (1.0 / s)).astype(np.float32))


@torch.no_grad()
def draft_logits(drafter, target, x, feats, anchors, B):
    """The drafter's logits [N, B-1, V] for every anchor in one batched forward.
    x: the sequence [T]; feats: the drafter's context features [S, n_layers * H] (positions 0..S-1)."""
    N, S = len(anchors), feats.shape[0]
    a = torch.as_tensor(anchors, dtype=torch.long)
    ids = torch.full((N, B), int(drafter.mask_token_id), dtype=torch.long)
    ids[:, 0] = x[a]
    noise = target.get_input_embeddings()(ids.view(1, -1))
    pos = torch.cat([torch.arange(S), (a[:, None] + torch.arange(B)[None, :]).flatten()])[None]
    mask = block_mask(anchors, B, S)[None, None]
    hid = drafter(position_ids=pos, attention_mask=mask, noise_embedding=noise, target_hidden=feats[None])
    hid = hid.view(N, B, -1)[:, 1:]
    return drafter.compute_logits(hid, target.lm_head).float()


@torch.no_grad()
def target_topk(target, last_hidden, K, how="torch"):
    """The target's top-K at each row of its last decoder layer's output [R, H]: ids [R, K],
    probabilities [R, K] (float32), left [R] (float64, the mass outside them)."""
    p = softmax(target.lm_head(target.model.norm(last_hidden)), how)
    pt, ids = p.topk(min(K, p.shape[-1]), dim=-1)
    return ids, pt, (1 - pt.double().sum(-1)).clamp_min(0)


@torch.no_grad()
def score_anchors(logits, x, anchors, tk=None, how="torch"):
    """Per-anchor results (tensors over anchors [N] x slots k = 1..B-1): valid, ok, margin (the
    label's logit minus the best other one), lead, alpha, left (float64; zero on invalid slots)."""
    N, Bm1, _ = logits.shape
    T = len(x)
    a = torch.as_tensor(anchors, dtype=torch.long)
    lab_pos = a[:, None] + torch.arange(1, Bm1 + 1)[None, :]
    valid = lab_pos <= T - 1
    labels = x[lab_pos.clamp(max=T - 1)]
    ok = (logits.argmax(-1) == labels) & valid
    lab_logit = logits.gather(-1, labels[..., None])[..., 0]
    other = logits.scatter(-1, labels[..., None], float("-inf")).max(-1).values
    r = {"anchors": anchors, "valid": valid, "ok": ok, "margin": lab_logit - other,
         "lead": ok.long().cumprod(-1).sum(-1)}
    if tk is not None:
        ids, pt, left = tk
        q = (lab_pos - 1).clamp(max=T - 2)
        pd = softmax(logits, how)
        alpha = torch.minimum(pd.gather(-1, ids[q]), pt[q]).double().sum(-1)
        r["alpha"] = torch.where(valid, alpha, torch.zeros_like(alpha))
        r["left"] = torch.where(valid, left[q], torch.zeros_like(alpha))
    return r


def subset(r, idx):
    """The results of the anchors at these indices (rows of r)."""
    idx = torch.as_tensor(idx, dtype=torch.long)
    out = {k: (v[idx] if torch.is_tensor(v) else [v[i] for i in idx.tolist()]) for k, v in r.items()}
    return out


def counts(r, T=None):
    """The train.jsonl count object of scored anchors (arrays over k = 1..B-1). T (the serving walk):
    a round whose leading run reaches the last label (position T - 1) commits no bonus token."""
    valid, ok, lead = r["valid"], r["ok"], r["lead"]
    k = torch.arange(1, valid.shape[1] + 1)[None, :]
    bonus = torch.ones_like(lead)
    if T is not None:
        bonus = (torch.as_tensor(r["anchors"]) + lead < T - 1).to(lead.dtype)
    c = {"anchors": len(r["anchors"]), "len_sum": float((bonus + lead).sum()),
         "valid": valid.sum(0).tolist(), "correct": ok.sum(0).tolist(),
         "cont": (valid & (k - 1 <= lead[:, None])).sum(0).tolist(),
         "reach": (valid & (k <= lead[:, None])).sum(0).tolist()}
    if "alpha" in r:
        prod = torch.where(r["valid"], r["alpha"], torch.zeros_like(r["alpha"])).cumprod(-1)
        c.update(exp_anchors=len(r["anchors"]), exp_len_sum=float((1 + prod.sum(-1)).sum()),
                 alpha=r["alpha"].sum(0).tolist(), left=r["left"].sum(0).tolist())
    return c


def walk(r_all, n_prompt, T):
    """Indices (into r_all, whose anchors are n_prompt..T-2) of the serving walk's round starts:
    p = n_prompt, then p += a(p) + 1 while p <= T - 2."""
    out, p = [], n_prompt
    while p <= T - 2:
        out.append(p - n_prompt)
        p += int(r_all["lead"][p - n_prompt]) + 1
    return out


class Reference:
    """The drafter and target loaded once (float32); row(...) scores one sequence."""

    def __init__(self, drafter_dir, target_dir, top_k=64, softmax="torch"):
        self.drafter = load_drafter(drafter_dir)
        self.target = load_target(target_dir)
        self.layers = list(self.drafter.target_layer_ids)
        self.B = int(self.drafter.block_size)
        self.last = self.target.config.num_hidden_layers - 1
        self.K, self.how = top_k, softmax

    def score(self, x, layers, anchors, tk=None):
        """x: the sequence [T]; layers: {k: [>= T-1, H]} target decoder-layer outputs; anchors: a list."""
        T = len(x)
        feats = torch.cat([layers[k][:T - 1] for k in self.layers], dim=-1)
        return score_anchors(draft_logits(self.drafter, self.target, x, feats, anchors, self.B), x, anchors, tk,
                             self.how)

    def row(self, x, n_prompt, layers, random_anchors):
        """The three count objects of a train.jsonl row ("random" on the given anchors in a forward of
        their own, "all", "walk") and the per-anchor results of each set."""
        T = len(x)
        tk = target_topk(self.target, layers[self.last][:T - 1], self.K, self.how) if self.last in layers else None
        r_all = self.score(x, layers, valid_anchors(n_prompt, T), tk)
        r_rnd = self.score(x, layers, list(random_anchors), tk)
        r_walk = subset(r_all, walk(r_all, n_prompt, T))
        res = {"random": r_rnd, "all": r_all, "walk": r_walk}
        return {k: counts(v, T if k == "walk" else None) for k, v in res.items()}, res
