"""Record a target's truths with Hugging Face transformers: the features directory `dfl eval
--features DIR` replays (docs/python.md, "Recording with transformers").

    import dflash_eval as dfl
    dfl.record("models/target", "data/gsm8k_test_40.jsonl", "features", drafter="models/drafter",
               device="cuda", dtype="bfloat16", max_new=256, limit=40)

The target runs in transformers (any device and dtype it supports), greedy: its tokens are the
truth, its decoder layers' outputs (taken with forward hooks while it generates: the last layer
before the final norm) the features. The prompt ids come from dfl itself (`dfl eval
--dump-prompts`), so they are the ids `dfl eval` would use; the target's identity (config and
weights hashes, the values dfl computes) and the recorder's settings go into every file and
target.json. Needs torch and transformers (`pip install 'dflash-eval[record]'`) and the `dfl`
executable ($DFL_BIN, the package's own, or `dfl` on PATH) for the prompts and the checkpoint's
description; not libdfl.so.

Also a command: python -m dflash_eval.recorder TARGET PROMPTS OUT_DIR [--drafter D | --layers 1,3]
[--device cuda] [--dtype bfloat16] [--max-new N] [--limit N] [--format F] [--chat MODE] ...
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

__all__ = ["record", "RecordError", "target_identity"]

FEATURES_FORMAT = "dfl-features-1"
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
_DTYPES = ("float32", "bfloat16", "float16")
_CHATS = ("chatml", "chatml-nothink", "none")
_DEFAULT_BLOCK = 16  # a DFlash drafter's usual block, when only layers are given


class RecordError(ValueError):
    """A recording refused or failed: the message names the input and what was expected."""


def _fnv1a(data, h=_FNV_OFFSET):
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def _need_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ImportError(f"dflash_eval.record needs torch and transformers ({e}): install the extra with "
                          f"pip install 'dflash-eval[record]' (or pip install torch transformers)") from None


def _dfl_bin(dfl_bin=None):
    """The dfl executable: the argument, $DFL_BIN, the package's bundled one, or dfl on PATH."""
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "dfl")
    given = dfl_bin or os.environ.get("DFL_BIN")  # what the caller named is used or refused, never replaced
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given
        raise RecordError(f"dfl executable {given}: not an executable file")
    if os.path.isfile(bundled) and os.access(bundled, os.X_OK):
        return bundled
    w = shutil.which("dfl")
    if not w:
        raise RecordError("the dfl executable was not found (the package's bin/dfl, $DFL_BIN or dfl on PATH): the "
                          "recorder asks it for the prompt ids and the target's description")
    return w


def _dfl(exe, *args):
    p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        msg = (p.stderr.strip() or p.stdout.strip()).splitlines()
        raise RecordError(f"dfl {args[0]}: {msg[-1] if msg else 'failed with status %d' % p.returncode}")
    return p.stdout


def _st_header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise RecordError(f"{path}: too short for a safetensors header")
        n = struct.unpack("<Q", raw)[0]
        hdr = json.loads(f.read(n))
    return 8 + n, hdr


def _weight_files(target):
    index = os.path.join(target, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        return [os.path.join(target, x) for x in sorted(set(wm.values()))]
    single = os.path.join(target, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise RecordError(f"{target}: no model.safetensors.index.json or model.safetensors")


def target_identity(target, info):
    """{"config_hash", "weights_hash", "layout", "dtype"} as dfl computes them (src/eval/target_id.c):
    FNV-1a 64 of config.json; of the used tensors' names (without the layout's prefix), shapes (int64)
    and first 4 KiB, in name order. info: `dfl inspect TARGET --json` (layout, prefix, unused tensors)."""
    with open(os.path.join(target, "config.json"), "rb") as f:
        config_hash = _fnv1a(f.read())
    unused = {n for names in (info.get("unused") or {}).values() for n in names}
    prefix = info.get("prefix") or ""
    tensors = []  # (name bytes, file, data start, entry)
    for path in _weight_files(target):
        start, hdr = _st_header(path)
        for name, e in hdr.items():
            if name != "__metadata__":
                tensors.append((name.encode(), path, start, e))
    tensors.sort(key=lambda x: x[0])  # strcmp order: bytewise
    h = _FNV_OFFSET
    embed_dtype = None
    handles = {}
    try:
        for name, path, start, e in tensors:
            sname = name.decode()
            if sname == prefix + "embed_tokens.weight":
                embed_dtype = e["dtype"]
            if sname in unused:
                continue
            short = name[len(prefix):] if prefix and name.startswith(prefix.encode()) else name
            h = _fnv1a(short, h)
            h = _fnv1a(struct.pack(f"<{len(e['shape'])}q", *e["shape"]), h)
            b, end = e["data_offsets"]
            if path not in handles:
                handles[path] = open(path, "rb")
            f = handles[path]
            f.seek(start + b)
            h = _fnv1a(f.read(min(end - b, 4096)), h)
    finally:
        for f in handles.values():
            f.close()
    dtype = "F8_E4M3" if info.get("quantization") else embed_dtype
    return {"config_hash": f"{config_hash:016x}", "weights_hash": f"{h:016x}", "layout": info["layout"],
            "dtype": dtype}


def _decoder_layers(model):
    for path in ("model.layers", "model.language_model.layers", "language_model.model.layers"):
        m = model
        try:
            for p in path.split("."):
                m = getattr(m, p)
            return m
        except AttributeError:
            continue
    raise RecordError(f"cannot find the decoder layers of this {type(model).__name__} (looked for model.layers, "
                      f"model.language_model.layers, language_model.model.layers)")


def _known_ids(tokenizer_json):
    """The ids dfl's tokenizer has (tok_has_id): the model's vocabulary and the added tokens."""
    with open(tokenizer_json, encoding="utf-8") as f:
        tj = json.load(f)
    vocab = (tj.get("model") or {}).get("vocab")
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab or [])))
    ids.update(a["id"] for a in tj.get("added_tokens") or [])
    return ids


def _prompt_hash(turns):
    """eval_prompt_hash: FNV-1a over "len:" + text of each user turn hashed."""
    h = _FNV_OFFSET
    for t in turns:
        b = t.encode()
        h = _fnv1a(f"{len(b)}:".encode(), h)
        h = _fnv1a(b, h)
    return f"{h:016x}"


def _atomic_write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _settings_text(s):
    return (f"transformers {s['transformers']} (torch {s['torch']}, {s['device']}, {s['dtype']}, "
            f"attn {s['attn_implementation']})")


def record(target, prompts, out_dir, *, drafter=None, layers=None, device="cpu", dtype="float32", max_new=None,
           format=None, chat=None, limit=None, first_turn=False, protocol=None, tokenizer=None, block_size=None,
           attn_implementation="eager", dfl_bin=None, progress=None):
    """Run `target` in transformers over the prompts, greedy, and write the features directory
    `out_dir` that `dfl eval --features out_dir --drafter D` replays. Returns target.json as a dict.

    layers: the target layers to save (the drafters' target_layer_ids), or drafter: a drafter
    directory or a list of them (their layers and largest block size). device, dtype: where and
    in which dtype transformers runs the target (float32, bfloat16, float16). max_new, format,
    chat, limit, first_turn, protocol, tokenizer: as dfl eval's options (defaults: 256, from the
    file, chatml, all prompts; protocol "zlab": 2048 and chatml-nothink). block_size: the
    continuation kept past an eos is block_size - 1 tokens (default: the drafters' largest block,
    else 16); a replayed drafter with a larger block is refused. progress(done, total, prompt_id)
    is called after each saved truth."""
    t_start = time.time()
    if not isinstance(target, (str, os.PathLike)) or not isinstance(out_dir, (str, os.PathLike)) \
            or not isinstance(prompts, (str, os.PathLike)):
        raise TypeError("target, prompts and out_dir: expected paths (str or os.PathLike)")
    target, prompts, out_dir = os.fspath(target), os.fspath(prompts), os.fspath(out_dir)
    if not os.path.isdir(target):
        raise RecordError(f"target {target}: not a directory")
    if not os.path.isfile(os.path.join(target, "config.json")):
        raise RecordError(f"target {target}: no config.json (not a checkpoint directory)")
    if not os.path.isfile(prompts):
        raise RecordError(f"prompts {prompts}: no such file")
    if dtype not in _DTYPES:
        raise RecordError(f"dtype: expected one of {', '.join(_DTYPES)}, found {dtype!r}")
    if chat is not None and chat not in _CHATS:
        raise RecordError(f"chat: expected one of {', '.join(_CHATS)}, found {chat!r}")
    if protocol not in (None, "zlab"):
        raise RecordError(f"protocol: expected None or 'zlab', found {protocol!r}")
    if chat is None:
        chat = "chatml-nothink" if protocol == "zlab" else "chatml"
    if max_new is None:
        max_new = 2048 if protocol == "zlab" else 256
    if not isinstance(max_new, int) or isinstance(max_new, bool) or not 1 <= max_new <= 1 << 24:
        raise RecordError(f"max_new: expected an integer in [1, {1 << 24}], found {max_new!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise RecordError(f"limit: expected a positive integer, found {limit!r}")
    if (drafter is None) == (layers is None):
        raise RecordError("give the layers to save (layers=[...]) or the drafter(s) that will read them (drafter=...), "
                          "one of the two")
    exe = _dfl_bin(dfl_bin)
    _need_torch()
    info = json.loads(_dfl(exe, "inspect", target, "--json"))
    n_layers, eos = info["num_layers"], info.get("eos_token_ids") or []
    drafters = []
    if drafter is not None:
        drafters = [os.fspath(d) for d in (drafter if isinstance(drafter, (list, tuple)) else [drafter])]
        want, blocks = set(), []
        for d in drafters:
            di = json.loads(_dfl(exe, "inspect", d, "--json"))
            if not di.get("target_layer_ids"):
                raise RecordError(f"drafter {d}: no target_layer_ids (not a DFlash drafter: dfl inspect says layout "
                                  f"{di.get('layout')!r})")
            want.update(di["target_layer_ids"])
            blocks.append(int(di.get("block_size") or _DEFAULT_BLOCK))
        layers = sorted(want)
        if block_size is None:
            block_size = max(blocks)
    else:
        if isinstance(layers, int):
            layers = [layers]
        if not all(isinstance(k, int) and not isinstance(k, bool) for k in layers) or not layers:
            raise RecordError(f"layers: expected a non-empty list of layer indices, found {layers!r}")
        layers = sorted(set(layers))
    bad = [k for k in layers if not 0 <= k < n_layers]
    if bad:
        raise RecordError(f"layers {bad}: the target {target} has decoder layers 0..{n_layers - 1}")
    if block_size is None:
        block_size = _DEFAULT_BLOCK
    if not isinstance(block_size, int) or not 1 <= block_size <= 256:
        raise RecordError(f"block_size: expected an integer in [1, 256], found {block_size!r}")
    extend = block_size - 1
    ident = target_identity(target, info)

    # the prompts exactly as dfl eval builds them (an empty --dump-answer lists second turns too)
    work = tempfile.mkdtemp(prefix="dfl-record-")
    dump_args = ["eval", "--prompts", prompts, "--tokenizer", tokenizer or target, "--chat", chat]
    if format:
        dump_args += ["--format", format]
    if limit:
        dump_args += ["--limit", limit]
    if first_turn:
        dump_args += ["--first-turn"]
    if protocol:
        dump_args += ["--protocol", protocol]
    try:
        dump = os.path.join(work, "prompts.jsonl")
        _dfl(exe, *dump_args, "--dump-prompts", dump, "--dump-answer", "")
        with open(dump, encoding="utf-8") as f:
            lines = [json.loads(x) for x in f if x.strip()]
        if not lines:
            raise RecordError(f"prompts {prompts}: no prompts")
        units = {}  # index -> {"id", "turns": [user...], "ids0"}
        for x in lines:
            u = units.setdefault(x["index"], {"id": x["prompt_id"], "turns": [x["user"]], "ids0": None})
            if x["turn"] == 0:
                u["ids0"] = x["ids"]
            else:
                u["turns"].append(x["user_2"])
        order = sorted(units)
        n_prompts = max(order) + 1

        # the output directory: a fresh one (dfl's --save-features rule)
        os.makedirs(out_dir, exist_ok=True)
        man_path = os.path.join(out_dir, "manifest.jsonl")
        if os.path.exists(man_path) and os.path.getsize(man_path) > 0:
            raise RecordError(f"{man_path} already lists saved truths: record into another directory")

        import torch
        import transformers
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM

        tdtype = getattr(torch, dtype)
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise RecordError(f"device {device!r}: {e}") from None
        model = AutoModelForCausalLM.from_pretrained(target, dtype=tdtype, attn_implementation=attn_implementation)
        model = model.to(dev).eval()
        dec = _decoder_layers(model)
        if len(dec) != n_layers:
            raise RecordError(f"transformers builds {len(dec)} decoder layers for {target}, dfl reads {n_layers}")
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        max_pos = getattr(cfg, "max_position_embeddings", 0) or 0
        settings = {"library": "transformers", "transformers": transformers.__version__, "torch": torch.__version__,
                    "device": str(dev), "dtype": dtype, "attn_implementation": attn_implementation,
                    "model_class": type(model).__name__, "greedy": True, "eos_token_ids": eos,
                    "block_size": block_size, "chat": chat, "format": format, "limit": limit,
                    "first_turn": bool(first_turn), "protocol": protocol, "drafters": drafters or None}
        rec_text = _settings_text(settings)
        two_turns = any(len(u["turns"]) > 1 for u in units.values())
        known = _known_ids(_tokenizer_json(tokenizer or target)) if two_turns else None

        def target_json(complete):
            return {"format": FEATURES_FORMAT, "target": target, **ident, "layers": layers, "max_new": max_new,
                    "prompts_file": prompts, "recorder": rec_text, "recorder_settings": settings,
                    "complete": complete,
                    "costs": {"measured": False, "context": 0, "reps": 0, "chain": {}, "tree": {},
                              "note": "not measured: the truths were recorded by transformers, no dfl target forward "
                                      "(a replay gives no modeled speedup)"}}

        _atomic_write(os.path.join(out_dir, "target.json"), json.dumps(target_json(False)) + "\n")
        total = sum(len(units[i]["turns"]) for i in order)
        done = 0
        eos_set = set(eos)
        with open(man_path, "w") as man:
            for i in order:
                u = units[i]
                answer = None
                for turn in range(len(u["turns"])):
                    if turn == 0:
                        pids = u["ids0"]
                    else:  # the second turn after the model's own answer, built by dfl
                        pids = _second_turn(exe, dump_args, work, i, n_prompts, answer)
                    if max_pos and len(pids) + max_new > max_pos:
                        raise RecordError(f"prompt {u['id']} turn {turn + 1}: {len(pids)} prompt tokens + max_new "
                                          f"{max_new} exceed the target's max_position_embeddings {max_pos}")
                    out, n, ext, feats = _generate(torch, model, dec, pids, layers, max_new, extend, eos_set, dev)
                    name = f"{i:05d}-t{turn}.safetensors"
                    T = len(pids) + n - 1
                    tens = {"input_ids": torch.tensor(pids + out[:n - 1], dtype=torch.int64),
                            "truth_ids": torch.tensor(out[:n + ext], dtype=torch.int64)}
                    for k in layers:
                        tens[f"layer.{k}"] = feats[k][:T].contiguous()
                    meta = {"format": FEATURES_FORMAT, "prompt_id": u["id"], "turn": str(turn),
                            "prompt_tokens": str(len(pids)), "tokens": str(n), "extended": str(ext),
                            "stop": "eos" if out[n - 1] in eos_set else "max_new", "max_new": str(max_new),
                            "target": target, "target_config_hash": ident["config_hash"],
                            "target_weights_hash": ident["weights_hash"], "target_layout": ident["layout"],
                            "target_dtype": ident["dtype"], "act": "f32", "recorder": rec_text}
                    path = os.path.join(out_dir, name)
                    save_file(tens, path + ".tmp", metadata=meta)
                    os.replace(path + ".tmp", path)
                    man.write(json.dumps({"index": i, "prompt_id": u["id"], "turn": turn, "file": name,
                                          "prompt_tokens": len(pids), "tokens": n,
                                          "prompt_hash": _prompt_hash(u["turns"][:1] if first_turn else u["turns"])})
                              + "\n")
                    man.flush()
                    if turn == 0 and len(u["turns"]) > 1:
                        answer = _decode(exe, tokenizer or target, [x for x in out[:n] if x in known])
                    done += 1
                    if progress:
                        progress(done, total, u["id"])
        tj = target_json(True)
        tj["recorder_settings"]["seconds"] = round(time.time() - t_start, 3)
        _atomic_write(os.path.join(out_dir, "target.json"), json.dumps(tj) + "\n")
        return tj
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _tokenizer_json(path):
    p = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(p):
        raise RecordError(f"{path}: no tokenizer.json")
    return p


def _decode(exe, tokenizer, ids):
    """The answer text as dfl decodes it for a second turn (prompt_decode: special tokens skipped)."""
    if not ids:
        return ""
    return json.loads(_dfl(exe, "tokenize", "--tokenizer", tokenizer, "--decode", "--skip-special", "--json",
                           "--text", " ".join(map(str, ids))))


def _second_turn(exe, dump_args, work, index, n_prompts, answer):
    dump = os.path.join(work, f"turn2-{index}.jsonl")
    _dfl(exe, *dump_args, "--shard", f"{index}/{n_prompts}", "--dump-prompts", dump, "--dump-answer", answer)
    with open(dump, encoding="utf-8") as f:
        for x in f:
            x = json.loads(x)
            if x["index"] == index and x["turn"] == 1:
                return x["ids"]
    raise RecordError(f"dfl eval --dump-prompts gave no second turn for prompt index {index}")


def _generate(torch, model, dec, pids, layers, max_new, extend, eos, dev):
    """Greedy: max_new tokens or up to an eos, then up to `extend` more past it (within max_new);
    returns (tokens, n, n_ext, {layer: float32 CPU [rows, H]}) with the layers' outputs at every
    position fed to the model."""
    got = {k: [] for k in layers}

    def hook(k):
        def f(_mod, _inp, out):
            x = out[0] if isinstance(out, (tuple, list)) else out
            got[k].append(x[0].detach())
        return f

    hooks = [dec[k].register_forward_hook(hook(k)) for k in layers]
    out, n = [], None
    try:
        with torch.no_grad():
            o = model(input_ids=torch.tensor([pids], dtype=torch.long, device=dev), use_cache=True)
            while True:
                tok = int(torch.argmax(o.logits[0, -1]))
                out.append(tok)
                if n is None and (tok in eos or len(out) >= max_new):
                    n = len(out)
                    if tok not in eos:
                        break
                if n is not None and len(out) >= min(n + extend, max_new):
                    break
                o = model(input_ids=torch.tensor([[tok]], dtype=torch.long, device=dev),
                          past_key_values=o.past_key_values, use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    feats = {k: torch.cat(got[k]).to(device="cpu", dtype=torch.float32) for k in layers}
    return out, n, len(out) - n, feats


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dflash_eval.recorder", description=__doc__.split("\n")[0])
    ap.add_argument("target")
    ap.add_argument("prompts")
    ap.add_argument("out_dir")
    ap.add_argument("--drafter", action="append", help="a drafter whose layers to save (repeatable)")
    ap.add_argument("--layers", help="comma-separated target layers (instead of --drafter)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=_DTYPES)
    ap.add_argument("--max-new", type=int)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--format")
    ap.add_argument("--chat", choices=_CHATS)
    ap.add_argument("--first-turn", action="store_true")
    ap.add_argument("--protocol", choices=["zlab"])
    ap.add_argument("--tokenizer")
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--attn-implementation", default="eager")
    a = ap.parse_args(argv)
    layers = [int(x) for x in a.layers.split(",")] if a.layers else None
    try:
        tj = record(a.target, a.prompts, a.out_dir, drafter=a.drafter, layers=layers, device=a.device, dtype=a.dtype,
                    max_new=a.max_new, format=a.format, chat=a.chat, limit=a.limit, first_turn=a.first_turn,
                    protocol=a.protocol, tokenizer=a.tokenizer, block_size=a.block_size,
                    attn_implementation=a.attn_implementation,
                    progress=lambda d, t, pid: print(f"[record] {d}/{t} {pid}", file=sys.stderr, flush=True))
    except RecordError as e:
        sys.exit(f"record: {e}")
    print(f"[record] {tj['recorder']}: layers {tj['layers']} -> {a.out_dir}")


if __name__ == "__main__":
    main()
