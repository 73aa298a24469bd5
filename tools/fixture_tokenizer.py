"""A small Qwen-shaped byte-level BPE tokenizer for the test fixtures.

Trained with HF `tokenizers` on the GSM8K train questions and answers. Same pipeline shape as
Qwen's tokenizer.json (NFC normalizer; Split(Qwen regex, Isolated) + ByteLevel(no prefix space,
no regex) pre-tokenizer; ByteLevel decoder and post-processor; BPE model), so the C tokenizer
reads it the same way. The special tokens come after the learned vocabulary, as in Qwen.

    python tools/fixture_tokenizer.py OUTDIR     # writes OUTDIR/tokenizer.json + tokenizer_config.json
"""
import argparse
import json
import os

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("DFL_DATA") or os.path.join(HERE, "..", "data")  # data/README.md
GSM8K_TRAIN = os.path.join(DATA, "datasets", "gsm8k", "train.jsonl")
QWEN_TOKENIZER = os.path.join(DATA, "tokenizers", "qwen3", "tokenizer.json")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
LEARNED_VOCAB = 1000 - len(SPECIALS)  # 256 byte symbols + merges; specials take ids 996..999

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def qwen_regex():
    with open(QWEN_TOKENIZER, encoding="utf-8") as f:
        pre = json.load(f)["pre_tokenizer"]
    return next(p for p in pre["pretokenizers"] if p["type"] == "Split")["pattern"]["Regex"]


def corpus():
    with open(GSM8K_TRAIN, encoding="utf-8") as f:
        for line in f:
            ex = json.loads(line)
            yield ex["question"]
            yield ex["answer"]


def train():
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen_regex()), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=LEARNED_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus(), trainer=trainer)
    assert tok.get_vocab_size() == LEARNED_VOCAB, tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False, single_word=False,
                                       lstrip=False, rstrip=False) for s in SPECIALS])
    # Normalise the BPE model fields to the exact form Qwen's file has.
    data = json.loads(tok.to_str())
    data["model"].update({"dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                          "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                          "ignore_merges": False})
    data["decoder"] = dict(data["post_processor"])  # Qwen: ByteLevel, all flags false
    return data


def tokenizer_config(ids):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(ids[s]): {"content": s, "lstrip": False, "normalized": False,
                                               "rstrip": False, "single_word": False, "special": True}
                                 for s in SPECIALS},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write(outdir):
    """Train and write tokenizer.json + tokenizer_config.json; return {special token: id}."""
    data = train()
    ids = {t["content"]: t["id"] for t in data["added_tokens"]}
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)
    with open(os.path.join(outdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(ids), f, ensure_ascii=False, indent=2)
    return ids


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    print(json.dumps(write(ap.parse_args().outdir)))
