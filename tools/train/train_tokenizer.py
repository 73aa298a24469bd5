"""Stage 1: the embedded models' byte-level BPE tokenizer, trained on GSM8K train.

    python tools/train/train_tokenizer.py OUTDIR     # OUTDIR/tokenizer.json + tokenizer_config.json

Same pipeline and file shape as the fixture tokenizer (tools/fixture_tokenizer.py) and Qwen's:
NFC normalizer, Split(Qwen regex, isolated) + ByteLevel pre-tokenizer, BPE with merges, ByteLevel
decoder/post-processor; special tokens <|endoftext|>, <|im_start|>, <|im_end|>, <|mask|> after the
learned vocabulary. Only the size differs: 4088 learned tokens (256 bytes + merges) + 4 specials =
4092 ids; the model's vocabulary rows 4092..4095 are the (unused) vision token ids.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import fixture_tokenizer  # noqa: E402

LEARNED = 4088
MODEL_VOCAB = 4096


def write(outdir):
    fixture_tokenizer.LEARNED_VOCAB = LEARNED  # read by fixture_tokenizer.train() at call time
    return fixture_tokenizer.write(outdir)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    t0 = time.time()
    ids = write(ap.parse_args().outdir)
    print(json.dumps(ids), f"{time.time() - t0:.1f}s")
