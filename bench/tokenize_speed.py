#!/usr/bin/env python3
"""Encoding speed: dfl tokenize vs HF tokenizers on a large corpus (GSM8K train by default).

    .venv/bin/python bench/tokenize_speed.py [--dfl build/dfl] [--tokenizer PATH] [--corpus FILE.jsonl] [--repeat 3]

Two shapes of input: one string per record (dfl --lines; HF encode() in a loop, and HF
encode_batch(), which is multi-threaded) and the whole corpus as one string. dfl is timed as
the process wall time minus the time of the same command on empty input (loading the
tokenizer); HF is timed around the encode calls on a freshly loaded tokenizer (cold cache, as
dfl's). Best of --repeat runs. Also checks that both give the same ids."""
import argparse
import json
import os
import subprocess
import time

from tokenizers import Tokenizer

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("DFL_DATA", os.path.join(SOURCE, "data"))


def run_dfl(args, data):
    t = time.perf_counter()
    r = subprocess.run(args, input=data, capture_output=True, check=True)
    return time.perf_counter() - t, r.stdout


def best(n, fn):
    times, out = [], None
    for _ in range(n):
        t, out = fn()
        times.append(t)
    return min(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dfl", default=os.environ.get("DFL_BIN", os.path.join(SOURCE, "build", "dfl")))
    ap.add_argument("--tokenizer", default=os.path.join(DATA, "tokenizers", "qwen3", "tokenizer.json"))
    ap.add_argument("--corpus", default=os.path.join(DATA, "datasets", "gsm8k", "train.jsonl"))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    with open(a.corpus, encoding="utf-8") as f:
        texts = [r["question"] + "\n" + r["answer"] for r in map(json.loads, f)]
    whole = "\n\n".join(texts)
    mb = len(whole.encode()) / 1e6
    print(f"corpus: {a.corpus}: {len(texts)} records, {mb:.2f} MB; tokenizer: {a.tokenizer}")

    lines = "".join(json.dumps(t) + "\n" for t in texts).encode()
    base = [a.dfl, "tokenize", "--tokenizer", a.tokenizer]
    load, _ = best(a.repeat, lambda: run_dfl(base + ["--lines"], b""))
    t_lines, out_lines = best(a.repeat, lambda: run_dfl(base + ["--lines"], lines))
    t_whole, out_whole = best(a.repeat, lambda: run_dfl(base, whole.encode()))
    dfl_lines = [json.loads(x) for x in out_lines.decode().split("\n")[:-1]]
    dfl_whole = [int(x) for x in out_whole.split()]

    def hf_loop():
        tok = Tokenizer.from_file(a.tokenizer)
        t = time.perf_counter()
        ids = [tok.encode(s).ids for s in texts]
        return time.perf_counter() - t, ids

    def hf_batch():
        tok = Tokenizer.from_file(a.tokenizer)
        t = time.perf_counter()
        ids = [e.ids for e in tok.encode_batch(texts)]
        return time.perf_counter() - t, ids

    def hf_whole():
        tok = Tokenizer.from_file(a.tokenizer)
        t = time.perf_counter()
        ids = tok.encode(whole).ids
        return time.perf_counter() - t, ids

    t_hf_loop, hf_ids = best(a.repeat, hf_loop)
    t_hf_batch, _ = best(a.repeat, hf_batch)
    t_hf_whole, hf_whole_ids = best(a.repeat, hf_whole)
    t = time.perf_counter()
    Tokenizer.from_file(a.tokenizer)
    hf_load = time.perf_counter() - t

    same = dfl_lines == hf_ids and dfl_whole == hf_whole_ids
    n_tok = sum(map(len, hf_ids))
    print(f"{n_tok} tokens; dfl and HF ids identical: {same}")
    print(f"load: dfl {load * 1e3:.0f} ms (process start + tokenizer.json), HF {hf_load * 1e3:.0f} ms")
    print(f"{'':34s} {'MB/s':>8s}")
    print(f"{'dfl, per record (--lines)':34s} {mb / max(t_lines - load, 1e-9):8.2f}")
    print(f"{'HF encode() per record':34s} {mb / t_hf_loop:8.2f}")
    print(f"{'HF encode_batch() (all cores)':34s} {mb / t_hf_batch:8.2f}   ({os.cpu_count()} cores)")
    print(f"{'dfl, whole corpus as one text':34s} {mb / max(t_whole - load, 1e-9):8.2f}")
    print(f"{'HF encode(), whole corpus':34s} {mb / t_hf_whole:8.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
