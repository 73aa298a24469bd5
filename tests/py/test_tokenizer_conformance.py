#!/usr/bin/env python3
"""Tokenizer conformance: `dfl tokenize` must give the same ids as HF `tokenizers` on every
string of a corpus (multilingual text, emoji, code, digits, special tokens, NFC cases, long and
whitespace-only inputs, random character soup, GSM8K), for the real Qwen3 tokenizer.json and for
two byte-level BPE tokenizers trained here with other pre-tokenizer settings. Also checked:
decode(encode(s)) == NFC(s), decode of arbitrary id slices (partial UTF-8) equals HF's decode,
invalid UTF-8 input, and CLI error handling.

Environment: DFL_BIN (the dfl binary), DFL_DATA (the repository's data/), DFL_SOURCE (repo root)."""
import json
import os
import random
import subprocess
import tempfile
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from dfltest import DATA, DFL, SOURCE, Tally

QWEN3 = os.path.join(DATA, "tokenizers", "qwen3", "tokenizer.json")

# The Qwen3.5 Split regex: like Qwen3's, but letters absorb combining marks (\p{M}).
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

tally = Tally("tokenizer conformance")
check = tally.check


def dfl(args, stdin=b""):
    r = subprocess.run([DFL, "tokenize"] + args, input=stdin, capture_output=True, timeout=600)
    return r.returncode, r.stdout, r.stderr.decode("utf-8", "replace")


def dfl_lines(args, lines):
    data = "".join(line + "\n" for line in lines).encode()
    rc, out, err = dfl(args + ["--lines"], data)
    if rc != 0:
        raise AssertionError(f"dfl tokenize {' '.join(args)} --lines failed (rc {rc}): {err}")
    return [json.loads(x) for x in out.decode().split("\n")[:-1]]


def dfl_encode(tok_path, texts):
    return dfl_lines(["--tokenizer", tok_path], [json.dumps(t) for t in texts])


def dfl_decode(tok_path, id_lists, skip=False):
    return dfl_lines(["--tokenizer", tok_path, "--decode"] + (["--skip-special"] if skip else []),
                     [json.dumps(ids) for ids in id_lists])


def load_corpus():
    with open(os.path.join(SOURCE, "tests", "data", "tokenizer", "corpus.jsonl"), encoding="utf-8", newline="\n") as f:
        corpus = [json.loads(line) for line in f]
    gsm = []
    with open(os.path.join(DATA, "datasets", "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            gsm.append(row["question"])
            gsm.append(row["answer"])
    corpus += gsm[:600]  # 300 questions and their answers
    # long inputs (> 10 KB)
    corpus.append("\n\n".join(gsm[:60]))
    corpus.append("".join(corpus[:40]) * 4)
    corpus.append("7" * 12000)
    corpus.append(" \n\t  " * 3000)
    corpus.append("word " * 5000 + "  ")
    with open(os.path.join(SOURCE, "src", "tokenizer", "tok_encode.c"), encoding="utf-8") as f:
        corpus.append(f.read())
    # random character soup: exercises every branch of the Split regexes
    pool = (list("abcXYZ'sStTlLdDmMrReEvV0123456789 !?.,;:-_\"#$%&()[]{}<>|\\/\t\n\r")
            + [" ", " ", "  ", "\r\n", "'s", "'LL", "'Ve", "<|im_start|>", "<|endoftext|>", "</think>"]
            + list("éÉßøñçüİıſ\u0301\u0308\u0323\u0903\u093f\u094d\u0915\u0937\u0930\u0627\u0644\u0645")
            + list("中文字日本語한국\u3000\u00a0\u2003\u0085\u180e\u200b\u200d\u2028\ufeff\u00ad")
            + ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "1️⃣", "①", "½", "٣", "४", "\U0001d400", "\x00", "\x7f"])
    rng = random.Random(1234)
    for _ in range(600):
        corpus.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 40))))
    return corpus


def describe_mismatch(name, s, want, got):
    i = next((k for k in range(min(len(want), len(got))) if want[k] != got[k]), min(len(want), len(got)))
    return (f"{name}: {s[:80]!r}{'...' if len(s) > 80 else ''} ({len(s)} chars): first difference at id "
            f"{i}: HF {want[max(0, i - 2):i + 3]} dfl {got[max(0, i - 2):i + 3]}")


def conformance(name, tok_path, corpus, rng, roundtrip=True):
    hf = Tokenizer.from_file(tok_path)
    want = [e.ids for e in hf.encode_batch(corpus)]
    got = dfl_encode(tok_path, corpus)
    for s, w, g in zip(corpus, want, got):
        check(w == g, describe_mismatch(name, s, w, g))

    # decode(encode(s)) == HF's decode, and == NFC(s) where HF round-trips (not for the trained
    # tokenizers: HF's ByteLevel decoder turns their added token "résumé" into "r\ufffdsum\ufffd")
    texts = dfl_decode(tok_path, want)
    hf_texts = hf.decode_batch(want, skip_special_tokens=False)
    for s, t, h in zip(corpus, texts, hf_texts):
        ok = t == h and (not roundtrip or t == unicodedata.normalize("NFC", s))
        check(ok, f"{name}: decode(encode({s[:60]!r})) = {t[:60]!r}, HF {h[:60]!r}")
    skipped = dfl_decode(tok_path, want, skip=True)
    hf_skipped = hf.decode_batch(want, skip_special_tokens=True)
    for s, t, h in zip(corpus, skipped, hf_skipped):
        check(t == h, f"{name}: decode --skip-special of {s[:60]!r}: {t[:60]!r} != HF {h[:60]!r}")

    # arbitrary slices and random ids: partial UTF-8 sequences must decode exactly like HF
    slices = []
    for ids in want:
        if len(ids) > 1:
            i = rng.randrange(len(ids))
            slices.append(ids[i:i + rng.randint(1, 4)])
    vocab = hf.get_vocab_size(with_added_tokens=True)
    slices += [[rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for _ in range(300)]
    for ids, t, h in zip(slices, dfl_decode(tok_path, slices), hf.decode_batch(slices, skip_special_tokens=False)):
        check(t == h, f"{name}: decode {ids}: {t!r} != HF {h!r}")


def invalid_utf8(tok_path):
    hf = Tokenizer.from_file(tok_path)
    cases = [b"\xff", b"abc\x80def", b"\xc3", b"caf\xc3", b"\xe2\x82", b"\xe2\x82x", b"\xf0\x9f\x98", b"\xf0\x9f\x98 a",
             b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5\xf6\xf7", b"\xe0\x80\xaf", b"\xf0\x80\x80",
             b"ok \xfe\xfe ok", b"<|im_start|>\x80<|im_end|>", b"e\xcc", b"e\xcc\x81\xcc", b"\x80" * 50 + b"z",
             "résumé".encode("latin-1"), "中文".encode("gbk")]
    for b in cases:
        rc, out, err = dfl(["--tokenizer", tok_path, "--json"], b)
        want = hf.encode(b.decode("utf-8", "replace")).ids
        check(rc == 0 and json.loads(out) == want, f"invalid UTF-8 {b!r}: rc {rc} {out!r} {err} != HF {want}")


def train(tmp, name, corpus, pre_tokenizer, normalizer, legacy_merges):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    # non-special added tokens: one matched on raw text, one on normalized text
    tok.add_tokens([AddedToken("</think>", normalized=False), AddedToken("re\u0301sume\u0301", normalized=True)])
    path = os.path.join(tmp, name, "tokenizer.json")
    os.makedirs(os.path.dirname(path))
    tok.save(path)
    if legacy_merges:  # the older "a b" string form of merges
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
    return path


def cli_errors(tmp):
    def fails(args, stdin=b"", what=""):
        rc, out, err = dfl(args, stdin)
        check(0 < rc < 128 and err.strip().startswith("dfl tokenize"), f"{what}: rc {rc}, stderr {err!r}")
        return err

    rc, out, _ = dfl(["--help"])
    check(rc == 0 and b"usage" in out, "--help exits 0 and prints usage")
    err = fails(["--tokenizer", os.path.join(tmp, "missing.json"), "--text", "x"], what="missing file")
    check("missing.json" in err, f"missing file message names the file: {err!r}")
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write('{"model": {"type": "BPE", "vocab": {"a": 0}, ')
    fails(["--tokenizer", bad, "--text", "x"], what="bad JSON")
    wp = os.path.join(tmp, "wordpiece.json")
    with open(QWEN3, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["type"] = "WordPiece"
    with open(wp, "w", encoding="utf-8") as f:
        json.dump(j, f)
    err = fails(["--tokenizer", wp, "--text", "x"], what="WordPiece model")
    check("model.type" in err and "WordPiece" in err, f"unsupported model message: {err!r}")
    fails(["--tokenizer", QWEN3, "--decode", "--text", "1 2 99999999"], what="id out of range")
    fails(["--tokenizer", QWEN3, "--decode", "--text", "1 two"], what="non-numeric id")
    fails(["--tokenizer", QWEN3, "--decode", "--text", "[1, 2"], what="unterminated id list")
    fails(["--tokenizer", QWEN3, "--frobnicate"], what="unknown option")
    fails(["--text", "x"], what="no --tokenizer")
    fails(["--tokenizer", QWEN3, "--lines"], b'"ok"\nnot json\n', what="bad --lines input")
    rc, out, _ = dfl(["--tokenizer", QWEN3, "--decode", "--text", "[9707, 11, 1879]"])
    check(rc == 0 and out == b"Hello, world\n", f"decode of a JSON array: {out!r}")
    rc, out, _ = dfl(["--tokenizer", os.path.dirname(QWEN3), "--text", "Hello world"])
    check(rc == 0 and out == b"9707 1879\n", f"directory path, plain output: {out!r}")


def main():
    if not os.path.exists(DFL):
        raise SystemExit(f"dfl binary not found: {DFL} (set DFL_BIN)")
    rng = random.Random(7)
    corpus = load_corpus()
    tally.run(conformance, "qwen3", QWEN3, corpus, rng)
    tally.run(invalid_utf8, QWEN3)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(DATA, "datasets", "gsm8k", "train.jsonl"), encoding="utf-8") as f:
            train_text = [json.loads(line)["question"] for _, line in zip(range(3000), f)]
        train_text += corpus[:62]
        qwen35 = train(tmp, "qwen35-style", train_text, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), normalizers.NFC(), False)
        tally.run(conformance, "trained qwen3.5-regex", qwen35, corpus, rng, False)
        gpt2 = train(tmp, "gpt2-style", train_text, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                     None, True)
        tally.run(conformance, "trained gpt2-bytelevel", gpt2, corpus, rng, False)
        tally.run(cli_errors, tmp)
    tally.done()


if __name__ == "__main__":
    main()
