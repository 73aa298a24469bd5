#!/usr/bin/env python3
"""Write the seed corpora of the fuzz harnesses: tests/fuzz/corpus/<harness>/ (committed).

A few valid and a few malformed inputs per harness, a few KB each. Standard library only.
Rerun after changing it: python3 tests/fuzz/make_corpus.py (it replaces the corpus dirs).
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def write(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ---------------------------------------------------------------------------


def st_file(tensors, meta=None, pad=True, header=None):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file (as the reference writes it)."""
    h, off, data = {}, 0, b""
    if meta is not None:
        h["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    hb = header if header is not None else compact(h).encode()
    if pad:
        hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + data


def safetensors():
    f32 = struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
    bf16 = struct.pack("<3H", 0x3F80, 0xC000, 0x7FC0)
    f16 = struct.pack("<2H", 0x3C00, 0x0001)
    write("safetensors", "f32_2x2", st_file([("w", "F32", [2, 2], f32)]))
    write("safetensors", "mixed_meta", st_file(
        [("a.bf16", "BF16", [3], bf16), ("b.f16", "F16", [1, 2], f16), ("c.i64", "I64", [1], struct.pack("<q", -7)),
         ("d.empty", "F32", [0, 4], b""), ("e.bool", "BOOL", [2], b"\x01\x00")],
        meta={"format": "pt", "k": "v"}))
    write("safetensors", "empty", st_file([]))
    write("safetensors", "scalar_u8", st_file([("s", "U8", [], b"\x2a")], pad=False))
    # malformed
    write("safetensors", "bad_short", b"\x08\x00\x00")
    write("safetensors", "bad_hdr_len", struct.pack("<Q", 1 << 40) + b"{}")
    write("safetensors", "bad_utf8", st_file([], header=b'{"\xff":1}'))
    write("safetensors", "bad_overlap", st_file([], header=compact(
        {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
         "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}).encode()) + b"abc")
    write("safetensors", "bad_trailing", st_file([("w", "U8", [1], b"x")]) + b"extra")
    write("safetensors", "bad_dtype", st_file([], header=b'{"w":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}') + b"x")
    write("safetensors", "bad_shape", st_file([], header=b'{"w":{"dtype":"F32","shape":[1e30,-1],"data_offsets":[0,4]}}')
          + b"xxxx")
    write("safetensors", "bad_meta", st_file([], header=b'{"__metadata__":{"a":1}}'))


def safetensors_index():
    h = "safetensors_index"
    write(h, "both", compact({"metadata": {"total_size": 20}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors",
                                                                            "z": "b.safetensors"}}))
    write(h, "one_shard", compact({"weight_map": {"y": "a.safetensors"}}))
    write(h, "empty_map", compact({"weight_map": {}}))
    write(h, "bad_wrong_shard", compact({"weight_map": {"x": "b.safetensors", "z": "b.safetensors"}}))
    write(h, "bad_missing", compact({"weight_map": {"q": "a.safetensors"}}))
    write(h, "bad_path", compact({"weight_map": {"x": "../a.safetensors"}}))
    write(h, "bad_nofile", compact({"weight_map": {"x": "c.safetensors"}}))
    write(h, "bad_types", '{"weight_map": {"x": 1}}')
    write(h, "bad_json", '{"weight_map": ')


# ---- config.json ---------------------------------------------------------------------------

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "vocab_size": 100, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
         "max_position_embeddings": 4096, "eos_token_id": [7, 9], "hidden_act": "silu", "attention_bias": False}
QWEN35_TEXT = {"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
               "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
               "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}}
QWEN35_VLM = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "tie_word_embeddings": True, "text_config": dict(QWEN35_TEXT, tie_word_embeddings=True),
              "vision_config": {"depth": 2}}
DRAFTER = {"architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_hidden_layers": 2,
           "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "vocab_size": 100, "num_target_layers": 8, "sliding_window": 16,
           "layer_types": ["sliding_attention", "full_attention"],
           "dflash_config": {"mask_token_id": 5, "block_size": 8, "target_layer_ids": [1, 6]}}


def config():
    write("config", "qwen3", compact(QWEN3))
    write("config", "qwen35_text", compact(QWEN35_TEXT))
    write("config", "qwen35_vlm", compact(QWEN35_VLM))
    write("config", "drafter", compact(DRAFTER))
    top = {k: v for k, v in DRAFTER.items() if k != "dflash_config"}
    write("config", "drafter_toplevel", compact(dict(top, mask_token_id=5, block_size=16, layer_types=None,
                                                     sliding_window=None)))
    d2 = dict(DRAFTER, architectures=["DFlash2DraftModel"], is_causal=False)
    d2["dflash_config"] = dict(DRAFTER["dflash_config"], conv_kernel_size=2, conv_group_size=16, selector_rank=8,
                               selector_top_k=4)
    write("config", "dflash2", compact(d2))
    write("config", "dflash2_toplevel", compact(dict(top, architectures=["DFlash2DraftModel"], mask_token_id=5,
                                                     block_size=8, conv_kernel_size=3, conv_group_size=32,
                                                     selector_rank=16, selector_top_k=6, layer_types=None,
                                                     sliding_window=None)))
    write("config", "bad_trailing", compact(QWEN3) + "x")
    write("config", "bad_dupkey", '{"model_type":"qwen3","a":{"b":1,"b":2}}')
    write("config", "bad_range", compact(dict(QWEN3, num_hidden_layers=1e300, eos_token_id=2.5)))
    write("config", "bad_arch", '{"model_type":"llama"}')
    write("config", "bad_empty", "")


# ---- tokenizer.json ------------------------------------------------------------------------

BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def tokenizer_json():
    tiny = {"normalizer": None, "pre_tokenizer": dict(BL, use_regex=True), "decoder": {"type": "ByteLevel"},
            "added_tokens": [{"id": 9, "content": "<s>", "special": True, "normalized": False}],
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "\u0120": 6,
                                               "\u0120a": 7, "<unk>": 8},
                      "merges": ["b c", "a b", "a bc", "\u0120 a"]}}
    write("tokenizer_json", "tiny", compact(tiny))
    unk = {"normalizer": {"type": "NFC"}, "pre_tokenizer": BL, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "ignore_merges": True,
                     "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "ac": 4, "<unk>": 5}, "merges": [["a", "b"]]}}
    write("tokenizer_json", "unk_fuse", compact(unk))
    # Qwen's layout in small: NFC, Split with the Qwen regex, ByteLevel, all 256 byte symbols
    byte_syms = []
    for b in range(256):
        byte_syms.append(chr(b) if (0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff) else None)
    n = 0
    for b in range(256):
        if byte_syms[b] is None:
            byte_syms[b] = chr(256 + n)
            n += 1
    vocab = {s: i for i, s in enumerate(byte_syms)}
    vocab.update({"\u0120t": 256, "he": 257, "\u0120the": 258})
    qwen = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 259, "content": "<|im_start|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True},
                             {"id": 260, "content": "<think>", "special": False, "normalized": False}],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                                       "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                 "behavior": "Isolated", "invert": False}, BL]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": False},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"]]}}
    write("tokenizer_json", "qwen_bytes", json.dumps(qwen, ensure_ascii=True, separators=(",", ":")))
    write("tokenizer_json", "bad_json", '{"model": {"type": "BPE", "vocab": {"a": 0}, ')
    write("tokenizer_json", "bad_wordpiece", compact(dict(tiny, model={"type": "WordPiece", "vocab": {}})))
    write("tokenizer_json", "bad_merge", compact(dict(tiny, model={"type": "BPE", "vocab": {"a": 0},
                                                                   "merges": ["a q"]})))
    write("tokenizer_json", "bad_regex", compact({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"}, BL]}}))
    write("tokenizer_json", "bad_added", compact(dict(tiny, added_tokens=[{"id": 1e300, "content": "<m>"}])))


# ---- tokenizer round trip (text) -----------------------------------------------------------


def tokenizer_roundtrip():
    write("tokenizer_roundtrip", "ascii", "Natalia sold clips to 48 of her friends in April.\n\nHow many?  ")
    write("tokenizer_roundtrip", "unicode", "caf\u00e9 na\u0131ve \u4e2d\u6587\u5b57 \U0001f600\U0001f44d\u200d "
                                            "\u0928\u092e\u0938\u094d\u0924\u0947 \u00a0\u3000\u2028x")
    write("tokenizer_roundtrip", "special", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
                                            "</think><|endoftext|><|mask|>")
    write("tokenizer_roundtrip", "nfd", "e\u0301 A\u030a \u1100\u1161\u11a8 >\u0338 a\u0323\u0302")
    write("tokenizer_roundtrip", "invalid", b"ok \xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end")
    write("tokenizer_roundtrip", "code", "def f(x):\r\n\tif x != 0: return {'a': [1, 2]}\t\n    # \u00e9\\n\0 tail")


# ---- prompt files --------------------------------------------------------------------------


def prompts():
    write("prompts", "gsm8k", "gsm8k\n" + "\n".join(compact(o) for o in [
        {"question": "What is 2+2?", "answer": "4"}, {"question": "Ten \u00e9 \\n?", "idx": 7},
        {"question": "x", "id": "q-3"}]) + "\n")
    write("prompts", "mtbench", "mtbench 1\n" + "\n".join(compact(o) for o in [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
        {"question_id": 82, "turns": ["One turn only."]}, {"id": "x", "turns": ["a", "b", "c"]}]) + "\n")
    write("prompts", "jsonl_field", "jsonl:prompt 5\n" + compact({"prompt": "hello", "id": 1}) + "\n\n"
          + compact({"prompt": "world"}) + "\r\n" + "not json\n" + compact({"prompt": 3}) + "\n")
    write("prompts", "text", "text\nfirst prompt\n\nsecond prompt\r\n\u4e2d\n")
    # stray carriage returns before a newline are no part of the prompt (a fuzzer's find, once failed)
    write("prompts", "text_cr", "text\na prompt\r\r\n  \nlast\r")
    write("prompts", "messages", "messages\n" + "\n".join(compact(o) for o in [
        {"id": "m1", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                                  {"role": "user", "content": "More"}]},
        {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]}]) + "\n")
    write("prompts", "sharegpt", "sharegpt 1\n" + "\n".join(compact(o) for o in [
        {"id": 3, "conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]},
        {"conversations": [{"from": "gpt", "value": "first"}]}, {"conversations": []}]) + "\n")
    write("prompts", "bad_format", "jsonl:\n{}\n")
    write("prompts", "bad_dup", "gsm8k\n" + compact({"question": "a", "id": 1}) + "\n"
          + compact({"question": "b", "id": "1"}) + "\n")
    write("prompts", "bad_turns", "mtbench\n" + compact({"turns": [1]}) + "\n" + compact({"turns": "x"}) + "\n")
    write("prompts", "bad_empty", "gsm8k 1\n\n\n")
    # NUL characters (escaped, raw) and ids that are no string or integer: refused
    write("prompts", "bad_nul", "gsm8k\n" + '{"question": "a\\u0000b", "id": 1}\n')
    write("prompts", "bad_nul_raw", b"text\nab\x00c\n")
    write("prompts", "bad_id", "gsm8k\n" + compact({"question": "a", "id": 1.5}) + "\n" + compact({"question": "b", "id": None}) + "\n")


# ---- results.jsonl lines -------------------------------------------------------------------


def results():
    base = {"prompt_id": "12", "turn": 0, "drafter": "models/drafter", "mode": "chain", "tokens": 57, "rounds": 9,
            "drafted": 135, "accepted": 48, "block_size": 16, "tau": 6.222222, "time_s": 0.512345,
            "prefill_s": 0.01, "draft_s": 0.2, "verify_s": 0.3, "rollback_s": 0.000123, "tree_depth_sum": 0,
            "match": True, "first_mismatch": -1, "method": "replay", "features": "dfl", "tree_nodes": 0,
            "modeled_s": 0.4, "modeled_ar_s": 0.9,
            "accept_hist": [1, 0, 2, 0, 1, 0, 3, 0, 1, 0, 0, 0, 0, 0, 0, 1],
            "pos_drafted": [9] * 15, "pos_accepted": [8, 7, 6, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0],
            "round_lengths": [6, 2, 7, 0, 4, 2, 15, 6, 6], "output_ids": [9707, 1879, 0, 151645]}
    write("results", "chain", compact(base))
    ar = dict(base, drafter="", mode="ar", rounds=0, drafted=0, accepted=0, block_size=0, tau=0, match=None,
              method="online", accept_hist=[0], pos_drafted=[], pos_accepted=[])
    for k in ("modeled_s", "modeled_ar_s", "round_lengths"):
        del ar[k]
    write("results", "ar", compact(ar))
    write("results", "ddtree", compact(dict(base, mode="ddtree-32", tree_depth_sum=48, tree_nodes=288, turn=1,
                                            prompt_id="mt/81 \"q\"\u00e9", features="pipeline", match=False,
                                            first_mismatch=3)))
    write("results", "bad_missing", compact({k: v for k, v in base.items() if k != "rounds"}))
    write("results", "bad_types", compact(dict(base, tokens="57", accept_hist={"a": 1})))
    write("results", "bad_block", compact(dict(base, block_size=100000)))
    write("results", "bad_huge", compact(dict(base, tokens=1e300, output_ids=[1e20, -1])))
    write("results", "bad_cut", compact(base)[:200])
    # whole files (eval_results_read): complete lines, a blank one, a partial last line of 1 byte
    write("results", "file_tail1", compact(base) + "\n\n" + compact(ar) + "\n{")
    write("results", "file_tail_cut", compact(base) + "\n" + compact(ar)[:50])


# ---- saved features (eval_features_load + eval_replay; H 4, layer 1, vocabulary 64) ----------


def features_file(np_, out, ext, stop, max_new, meta_edit=None):
    """A features file as eval --save-features writes it: prompt np_ ids, output ids out (+ ext continuation)."""
    prompt = [(3 * i + 1) % 64 for i in range(np_)]
    truth = [(5 * i + 2) % 64 for i in range(len(out) + ext)]
    rows = np_ + len(out) - 1
    ids = prompt + truth[: len(out) - 1]
    feat = b"".join(struct.pack("<f", ((r * 4 + c) % 7) / 7.0) for r in range(rows) for c in range(4))
    meta = {"format": "dfl-features-1", "prompt_id": "7", "turn": "0", "prompt_tokens": str(np_),
            "tokens": str(len(out)), "extended": str(ext), "stop": stop, "max_new": str(max_new), "target": "t",
            "target_config_hash": "0", "target_weights_hash": "0", "target_layout": "text", "target_dtype": "BF16",
            "act": "f32"}
    meta.update(meta_edit or {})
    return st_file([("input_ids", "I64", [rows], b"".join(struct.pack("<q", x) for x in ids)),
                    ("truth_ids", "I64", [len(truth)], b"".join(struct.pack("<q", x) for x in truth)),
                    ("layer.1", "F32", [rows, 4], feat)], meta=meta)


def features():
    write("features", "eos", features_file(3, list(range(6)), 4, "eos", 12))
    write("features", "max_new", features_file(2, list(range(8)), 0, "max_new", 8))
    # refused: the metadata disagree (a stop at max_new with fewer tokens once read past the truth)
    write("features", "bad_stop", features_file(3, list(range(6)), 0, "max_new", 40))
    write("features", "bad_tokens", features_file(3, list(range(6)), 4, "eos", 12, {"tokens": "9"}))


def main():
    for h in ("safetensors", "safetensors_index", "config", "tokenizer_json", "tokenizer_roundtrip", "prompts", "results", "features"):
        shutil.rmtree(os.path.join(OUT, h), ignore_errors=True)
    safetensors()
    safetensors_index()
    config()
    tokenizer_json()
    tokenizer_roundtrip()
    prompts()
    results()
    features()


if __name__ == "__main__":
    main()
