"""Write a random-weight checkpoint of a released model's exact shape, fast (GPU benchmarks of
models too large to write with transformers in reasonable time):

    python tools/make_big_model.py OUTDIR [--shape qwen3.6-27b] [--layers N] [--threads T]
                                   [--tokenizer DIR] [--force]

OUTDIR gets BF16 safetensors shards of at most --shard-gb (4) GB each, model.safetensors.index.json
(weight_map, metadata.total_size), config.json and generation_config.json as transformers'
save_pretrained writes them for the text-only layout (`model.embed_tokens.weight`,
`model.layers.N.*`, `model.norm.weight`, `lm_head.weight` unless tied), and the tokenizer files
of --tokenizer DIR if given. Shapes (--shape):

    qwen3.6-27b   Qwen3_5ForCausalLM (qwen3_5_text): hidden 5120, 64 layers (full attention every
                  4th), intermediate 17408, 24/4 heads of 256 with output gate, Gated DeltaNet
                  16 key / 48 value heads of 128, vocab 248320 untied: 53.8 GB (26.9 B parameters)
    qwen3-8b      Qwen3ForCausalLM: hidden 4096, 36 layers, intermediate 12288, 32/8 heads of
                  128, vocab 151936 untied: 16.4 GB
    qwen3.6-35b-a3b  Qwen3_5MoeForCausalLM (qwen3_5_moe_text): hidden 2048, 40 layers (full
                  attention every 4th), 256 experts of 512 (top 8, fused gate_up_proj / down_proj)
                  plus a shared expert of 512, 16/2 heads of 256 with output gate, Gated DeltaNet
                  16 key / 32 value heads of 128, vocab 248320 untied: 69.3 GB (34.7 B parameters,
                  about 3 B read per token)
    tiny          qwen3_5_text, hidden 256, 4 layers, 4/2 heads of 64, DeltaNet 2/6 heads of 64,
                  vocab 4096 (tests); tiny-qwen3: Qwen3ForCausalLM of the same size; tiny-moe: the
                  tiny shape with qwen3.6-35b-a3b's MoE block (8 experts of 64, top 2, shared 64)
    dflash-27b    a DFlash drafter for qwen3.6-27b (z-lab format, dflash's DFlashDraftModel): hidden
                  5120, 5 layers, block 16, 32/8 heads of 128, intermediate 17408, target layers
                  [1, 16, 31, 46, 61]; no embedding or lm_head (the target's): 3.5 GB

--holes leaves every decoder layer's tensors as holes of a sparse file: zeros that take no disk,
with the header, embedding, final norm and lm_head written as above. For measurements that never
read the layers (`dfl bench --parts probe,draft`: a replay's drafting against the target's decode
floor, which comes from the tensors' sizes): qwen3.6-27b then takes 5.1 GB of disk, not 53.8.
Its outputs are meaningless: never run a forward over it.

--layers N keeps every dimension and writes N layers (the layer_types pattern continues: full
attention every 4th), e.g. `--layers 4` of qwen3.6-27b (LLLF) is 8.2 GB, `--layers 2` 6.6 GB (the
embeddings and lm_head alone are 5.1 GB). Under 4 layers a Qwen3.5 shape has no full-attention
layer, which transformers' cache refuses (forward with use_cache=False still runs).

Tensor names and shapes come from transformers: the model is instantiated on the meta device (no
memory) and its state_dict is what is written. Values: every matrix of nn.Linear or nn.Embedding
of >= --pool-from (4 M) elements is tiled from one of 4 pools of 64 M BF16 values drawn
N(0, 1 / fan_in), rounded toward zero (one set of pools per distinct fan_in, generated in parallel
into shared memory), starting at an offset and pool picked by the CRC32 of the tensor's name, so
that tensors differ but cost only a copy; smaller tensors are drawn exactly (numpy, seeded by the
name) as tools/make_bench_model.py's randomize draws them: matrices N(0, 1 / fan_in), conv1d
N(0, 1 / kernel), Qwen3.5's zero-centred RMSNorm (y = x_hat * (1 + w)) 0.1 N(0, 1), other norms
(Qwen3's, the DeltaNet's gated norm) 1 + 0.1 N(0, 1), A_log = log U(0.05, 1), dt_bias 0.5 N(0, 1).
Activations stay O(1): each sublayer about keeps the RMS of its normalized input, so the residual
grows as sqrt(depth) (RMS ~6 after 64 layers of the tiny shape) and logits have std ~1.
Deterministic: the same arguments give byte-identical files, whatever --threads. Each shard is
written by its own forked process (--threads at a time, default all cores), by hand in the
safetensors format (8-byte little-endian header size, JSON header padded with spaces to a 64-byte
boundary, raw data). Refuses an OUTDIR that holds a model unless --force (which first removes its
*.safetensors and index).
"""
import argparse
import json
import math
import mmap
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import struct
import sys
import time
import zlib

import numpy as np

POOLS = 4                 # pools per distinct standard deviation
POOL_ELEMS = 2**26 - 5    # 64 M values each; not a power of two, so periods miss row lengths
CHUNK = 1 << 22           # pool generation unit (fixed: the values do not depend on --threads)
BIG = 1 << 22             # tensors from this many elements on are tiled from the pools
WRITE_MAX = 1 << 30       # bytes per write() call

QWEN35_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
               "mrope_section": [11, 11, 10], "mrope_interleaved": True}
QWEN35_TOKENS = dict(bos_token_id=248044, eos_token_id=248046, pad_token_id=248044)

# arch, config values (the Qwen3.5 ones also get layer_types from num_hidden_layers)
SHAPES = {
    "qwen3.6-27b": ("qwen3_5", dict(
        vocab_size=248320, hidden_size=5120, num_hidden_layers=64, intermediate_size=17408,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, max_position_embeddings=262144, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters=QWEN35_ROPE, attn_output_gate=True, **QWEN35_TOKENS)),
    "qwen3-8b": ("qwen3", dict(
        vocab_size=151936, hidden_size=4096, num_hidden_layers=36, intermediate_size=12288,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=151643, eos_token_id=151645)),
    "qwen3.6-35b-a3b": ("qwen3_5_moe", dict(
        vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_experts=256, num_experts_per_tok=8,
        moe_intermediate_size=512, shared_expert_intermediate_size=512, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=QWEN35_ROPE, **QWEN35_TOKENS)),
    "tiny": ("qwen3_5", dict(
        vocab_size=4096, hidden_size=256, num_hidden_layers=4, intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
        linear_num_value_heads=6, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
        tie_word_embeddings=False, attn_output_gate=True,
        rope_parameters=dict(QWEN35_ROPE, mrope_section=[3, 3, 2]),
        bos_token_id=4088, eos_token_id=4090, pad_token_id=4088)),
    "dflash-27b": ("dflash", dict(
        vocab_size=248320, hidden_size=5120, num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=17408, max_position_embeddings=262144, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e7}, block_size=16,
        num_target_layers=64, dflash_config={"mask_token_id": 248077, "target_layer_ids": [1, 16, 31, 46, 61]})),
    "tiny-moe": ("qwen3_5_moe", dict(
        vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
        tie_word_embeddings=False, rope_parameters=dict(QWEN35_ROPE, mrope_section=[3, 3, 2]),
        bos_token_id=4088, eos_token_id=4090, pad_token_id=4088)),
    "tiny-qwen3": ("qwen3", dict(
        vocab_size=4096, hidden_size=256, num_hidden_layers=4, intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=4088, eos_token_id=4090)),
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json")


def build_config(shape, layers):
    arch, kw = SHAPES[shape]
    kw = dict(kw)
    if layers is not None:
        kw["num_hidden_layers"] = layers
    if arch == "qwen3_5":
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        n = kw["num_hidden_layers"]
        kw["layer_types"] = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
        cfg = Qwen3_5TextConfig(full_attention_interval=4, architectures=["Qwen3_5ForCausalLM"], **kw)
        cls = Qwen3_5ForCausalLM
    elif arch == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
        n = kw["num_hidden_layers"]
        kw["layer_types"] = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
        cfg = Qwen3_5MoeTextConfig(full_attention_interval=4, architectures=["Qwen3_5MoeForCausalLM"], **kw)
        cls = Qwen3_5MoeForCausalLM
    elif arch == "dflash":
        from transformers import Qwen3Config
        from dflash.model import DFlashDraftModel
        cfg = Qwen3Config(architectures=["DFlashDraftModel"], **kw)
        cls = DFlashDraftModel
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM
        cfg = Qwen3Config(architectures=["Qwen3ForCausalLM"], **kw)
        cls = Qwen3ForCausalLM
    cfg.dtype = "bfloat16"  # as save_pretrained records a BF16 model
    return cfg, cls


def tensor_specs(cfg, cls, big=BIG):
    """[(name, shape, kind, std)] in state_dict order, without the tied lm_head. kind: 'pool'
    (tiled from the pools with this std) or one of the exact draws of `small`."""
    import torch
    from torch import nn
    with torch.device("meta"):
        model = cls(cfg)
    owner = {}
    for mname, m in model.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            owner[f"{mname}.{pname}" if mname else pname] = (m, pname)
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if cfg.tie_word_embeddings else set()
    specs = []
    for name, t in model.state_dict().items():
        if name in tied:
            continue
        shape, numel = tuple(t.shape), t.numel()
        m, pname = owner[name]
        tname = type(m).__name__
        if isinstance(m, (nn.Linear, nn.Embedding)) and pname == "weight":
            std = 1.0 / math.sqrt(shape[1])
            specs.append((name, shape, "pool" if numel >= big else "normal", std))
        elif tname.endswith("TopKRouter") and pname == "weight":  # the MoE router: [E, H]
            specs.append((name, shape, "normal", 1.0 / math.sqrt(shape[1])))
        elif tname.endswith("Experts"):  # fused experts: gate_up_proj [E, 2 Ie, H], down_proj [E, H, Ie]
            specs.append((name, shape, "pool" if numel >= big else "normal", 1.0 / math.sqrt(shape[-1])))
        elif isinstance(m, nn.Conv1d) and pname == "weight":
            specs.append((name, shape, "normal", 1.0 / math.sqrt(m.kernel_size[0])))
        elif tname in ("Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm"):  # zero-centred: y = x_hat * (1 + w)
            specs.append((name, shape, "normal", 0.1))
        elif "RMSNorm" in tname and pname == "weight":
            specs.append((name, shape, "one_plus", 0.1))
        elif "GatedDeltaNet" in tname and pname == "A_log":
            specs.append((name, shape, "a_log", 0.0))
        elif "GatedDeltaNet" in tname and pname == "dt_bias":
            specs.append((name, shape, "normal", 0.5))
        else:
            raise SystemExit(f"make_big_model: no rule for parameter {name} ({tname}.{pname}); add one")
    return specs


def to_bf16(x):
    """float32 array -> BF16 bits (uint16), round to nearest even, as torch converts."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def seed_of(s):
    return zlib.crc32(s.encode())


def small(name, shape, kind, std):
    rng = np.random.default_rng(seed_of(name))
    n = math.prod(shape)
    if kind == "a_log":
        x = np.log(rng.uniform(0.05, 1.0, n))
    elif kind == "one_plus":
        x = 1.0 + std * rng.standard_normal(n)
    else:
        x = std * rng.standard_normal(n)
    return to_bf16(x.astype(np.float32)).tobytes()


# --- the pools: POOLS x len(stds) regions of pool_elems BF16 values in one shared anonymous mapping,
# inherited by the forked writers

def gen_chunks(buf, stds, pool_elems, jobs):
    arr = np.frombuffer(buf, dtype=np.uint16)
    for p, c in jobs:
        lo = c * CHUNK
        n = min(CHUNK, pool_elems - lo)
        x = np.random.default_rng([p, c, 12345]).standard_normal(n, dtype=np.float32)
        for s, std in enumerate(stds):  # BF16 by truncation (the high halves): 5x cheaper than rounding
            base = (s * POOLS + p) * pool_elems + lo
            arr[base:base + n] = (x * np.float32(std)).view(np.uint16)[1::2]


def run_procs(targets, threads):
    """Run callables in forked processes, `threads` at a time; fail if any fails."""
    ctx = mp.get_context("fork")
    pending, running = list(targets), []
    while pending or running:
        while pending and len(running) < threads:
            pr = ctx.Process(target=pending.pop(0))
            pr.start()
            running.append(pr)
        done = mp.connection.wait([pr.sentinel for pr in running])
        for pr in [pr for pr in running if pr.sentinel in done]:
            running.remove(pr)
            pr.join()
            if pr.exitcode:
                for q in running:
                    q.terminate()
                raise SystemExit(f"make_big_model: a worker failed (exit code {pr.exitcode})")


def make_pools(stds, pool_elems, threads):
    buf = mmap.mmap(-1, max(2, len(stds) * POOLS * pool_elems * 2))
    jobs = [(p, c) for p in range(POOLS) for c in range((pool_elems + CHUNK - 1) // CHUNK)]
    nw = max(1, min(threads, len(jobs)))
    run_procs([(lambda js=jobs[i::nw]: gen_chunks(buf, stds, pool_elems, js)) for i in range(nw)], nw)
    return buf


# --- shards

def write_all(fd, mv):
    while len(mv):
        k = os.write(fd, mv[:WRITE_MAX])
        mv = mv[k:]


def is_layer(name):
    return ".layers." in name or name.startswith("layers.")


def write_shard(path, tensors, buf, std_index, pool_elems, holes=False):
    header, off = {}, 0
    for name, shape, kind, std in tensors:
        nb = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 64)
    mv = memoryview(buf)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, memoryview(struct.pack("<Q", len(h)) + h))
        for name, shape, kind, std in tensors:
            n = math.prod(shape)
            if holes and is_layer(name):  # --holes: skipped, read back as zeros
                os.lseek(fd, n * 2, os.SEEK_CUR)
                continue
            if kind != "pool":
                write_all(fd, memoryview(small(name, shape, kind, std)))
                continue
            region = (std_index[std] * POOLS + seed_of(name + "#pool") % POOLS) * pool_elems
            pos = seed_of(name) % pool_elems
            while n:
                k = min(n, pool_elems - pos)
                write_all(fd, mv[(region + pos) * 2:(region + pos + k) * 2])
                n -= k
                pos = 0
        os.ftruncate(fd, 8 + len(h) + off)  # a trailing hole counts too
    finally:
        os.close(fd)


def plan_shards(specs, shard_bytes):
    shards, cur, size = [], [], 0
    for sp in specs:
        nb = math.prod(sp[1]) * 2
        if cur and size + nb > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(sp)
        size += nb
    if cur:
        shards.append(cur)
    return shards


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.6-27b")
    ap.add_argument("--layers", type=int, help="number of layers (default: the shape's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="processes (default: all cores)")
    ap.add_argument("--shard-gb", type=float, default=4.0, help="largest shard, GB (1e9 bytes)")
    ap.add_argument("--tokenizer", help="copy the tokenizer files of this directory")
    ap.add_argument("--force", action="store_true", help="replace a model already in OUTDIR")
    ap.add_argument("--holes", action="store_true", help="decoder layers as holes of a sparse file (zeros, no "
                    "disk): for dfl bench --parts probe,draft; never run a forward over it")
    ap.add_argument("--pool-from", type=int, default=BIG, help="matrices of this many elements on are tiled "
                    "from the pools (default 4 M; tests lower it to exercise the pools on a tiny shape)")
    a = ap.parse_args()
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be >= 1")
    t0 = time.perf_counter()
    out = a.outdir
    if os.path.exists(os.path.join(out, "config.json")) or os.path.exists(
            os.path.join(out, "model.safetensors.index.json")):
        if not a.force:
            print(f"{out}: holds a model (--force replaces it)", file=sys.stderr)
            return 1
        for f in os.listdir(out):
            if f.endswith(".safetensors") or f == "model.safetensors.index.json":
                os.remove(os.path.join(out, f))
    os.makedirs(out, exist_ok=True)

    from transformers import GenerationConfig
    cfg, cls = build_config(a.shape, a.layers)
    specs = tensor_specs(cfg, cls, a.pool_from)
    stds = sorted({sp[3] for sp in specs if sp[2] == "pool"})
    pool_elems = min(POOL_ELEMS, max([math.prod(sp[1]) for sp in specs if sp[2] == "pool"] or [0]))
    shards = plan_shards(specs, int(a.shard_gb * 1e9))
    total = sum(math.prod(sp[1]) * 2 for sp in specs)
    t1 = time.perf_counter()

    buf = make_pools(stds, pool_elems, a.threads)
    t2 = time.perf_counter()

    n = len(shards)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" if n > 1 else "model.safetensors" for i in range(n)]
    std_index = {s: i for i, s in enumerate(stds)}
    run_procs([(lambda p=os.path.join(out, f), ts=ts: write_shard(p, ts, buf, std_index, pool_elems, a.holes))
               for f, ts in zip(files, shards)], max(1, a.threads))
    t3 = time.perf_counter()

    if n > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {sp[0]: f for f, ts in zip(files, shards) for sp in ts}}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
    cfg.save_pretrained(out)
    GenerationConfig.from_model_config(cfg).save_pretrained(out)
    if a.tokenizer:
        copied = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(a.tokenizer, f))]
        if not copied:
            print(f"{a.tokenizer}: no tokenizer files ({', '.join(TOKENIZER_FILES)})", file=sys.stderr)
            return 1
        for f in copied:
            shutil.copyfile(os.path.join(a.tokenizer, f), os.path.join(out, f))
    t4 = time.perf_counter()
    params = total // 2
    print(f"wrote {out}: {a.shape}, {cfg.num_hidden_layers} layers, {len(specs)} tensors, {params / 1e9:.3f} B "
          f"parameters, {total / 1e9:.2f} GB in {n} shard(s); {t4 - t0:.1f} s (meta model {t1 - t0:.1f} s, "
          f"pools {t2 - t1:.1f} s, shards {t3 - t2:.1f} s = {total / 1e9 / max(t3 - t2, 1e-9):.2f} GB/s, "
          f"{a.threads} processes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
