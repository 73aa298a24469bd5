"""Shared pieces of the embedded-model pipeline (tools/train/): paths, data, chat format."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
DATA = os.environ.get("DFL_DATA") or os.path.join(SOURCE, "data")  # data/README.md
GSM8K_TRAIN = os.path.join(DATA, "datasets", "gsm8k", "train.jsonl")
GSM8K_TEST = os.path.join(DATA, "datasets", "gsm8k", "test.jsonl")
WORK = os.path.join(SOURCE, "build", "train")  # intermediate artifacts (git-ignored)
DFL = os.environ.get("DFL_BIN", os.path.join(SOURCE, "build", "dfl"))
sys.path.insert(0, os.path.join(SOURCE, "tools"))


def read_jsonl(path, n=None):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if n is not None and len(out) >= n:
                break
            out.append(json.loads(line))
    return out


def chat_prompt(question):
    """The user turn + assistant header, exactly what `dfl generate --chat chatml` builds."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def log(msg):
    print(msg, flush=True)
