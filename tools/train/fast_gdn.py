"""A faster training-time form of transformers' torch_chunk_gated_delta_rule (same function).

transformers' CPU fallback builds the chunk's UT transform T = (I + tril(diag(beta) K K^T * decay, -1))^-1
with a 63-step Python loop of in-place row updates, which dominates training time on CPU (and its
backward even more). Here the same T comes from one batched triangular solve; everything else is the
reference algorithm. `patch()` swaps it into transformers' Qwen3.5 module for training only — the
saved checkpoints are ordinary Qwen3.5 weights, evaluated with the unmodified code.
"""
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as mq


def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    initial_dtype = query.dtype
    if use_qk_l2norm_in_kernel:
        query = mq.l2norm(query, dim=-1, eps=1e-6)
        key = mq.l2norm(key, dim=-1, eps=1e-6)
    query, key, value, beta, g = [x.transpose(1, 2).contiguous().to(torch.float32)
                                  for x in (query, key, value, beta, g)]
    B, Hn, T, dk = key.shape
    dv = value.shape[-1]
    pad = (chunk_size - T % chunk_size) % chunk_size
    query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    n = (T + pad) // chunk_size
    query = query * dk ** -0.5
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, value, k_beta, v_beta = (x.reshape(B, Hn, n, chunk_size, x.shape[-1])
                                         for x in (query, key, value, k_beta, v_beta))
    g = g.reshape(B, Hn, n, chunk_size).cumsum(-1)
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().tril()
    eye = torch.eye(chunk_size, dtype=query.dtype)
    strict = torch.tril(torch.ones(chunk_size, chunk_size, dtype=torch.bool), -1)
    m = ((k_beta @ key.transpose(-1, -2)) * decay).masked_fill(~strict, 0)
    # (I + m)^-1 for strictly lower (nilpotent) m: prod_{j<log2(C)} (I + (-m)^(2^j)), batched matmuls only
    nm = -m
    tmat = eye + nm
    for _ in range(chunk_size.bit_length() - 2):
        nm = nm @ nm
        tmat = tmat + tmat @ nm
    value = tmat @ v_beta
    k_cumdecay = tmat @ (k_beta * g.exp().unsqueeze(-1))
    state = (torch.zeros(B, Hn, dk, dv, dtype=value.dtype) if initial_state is None
             else initial_state.to(value))
    upper = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), 1)
    outs = []
    for i in range(n):
        q_i, k_i, v_i, g_i = query[:, :, i], key[:, :, i], value[:, :, i], g[:, :, i]
        attn = (q_i @ k_i.transpose(-1, -2) * decay[:, :, i]).masked_fill(upper, 0)
        v_new = v_i - k_cumdecay[:, :, i] @ state
        outs.append((q_i * g_i[..., None].exp()) @ state + attn @ v_new)
        state = state * g_i[..., -1, None, None].exp() + \
            (k_i * (g_i[..., -1, None] - g_i).exp()[..., None]).transpose(-1, -2) @ v_new
    out = torch.stack(outs, 2).reshape(B, Hn, -1, dv)[:, :, :T]
    return out.transpose(1, 2).contiguous().to(initial_dtype), (state if output_final_state else None)


def patch():
    mq.torch_chunk_gated_delta_rule = chunk_gated_delta_rule
