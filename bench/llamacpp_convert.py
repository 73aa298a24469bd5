"""Run llama.cpp's convert_hf_to_gguf.py, with one fallback for a tokenizer it does not know
(used by bench/peer-llamacpp, in the converter's own venv):

    python bench/llamacpp_convert.py LLAMA_CPP_DIR [--vocab-pre NAME] -- CONVERTER ARGS...

The converter names a BPE tokenizer's pre-tokenizer by hashing the ids of a test string and
refuses hashes it has no entry for. The embedded pair's tokenizer (models/target, 4,096 tokens
trained here) has Qwen's pre-tokenizer (the same Split regex and ByteLevel step as Qwen3's
tokenizer.json; bench/peer-llamacpp checks this before passing --vocab-pre qwen2) but its own
vocabulary, so its hash is unknown. With --vocab-pre, an unknown hash gets NAME instead of the
converter's NotImplementedError; a known hash is left as the converter decides.
"""
import os
import runpy
import sys


def main():
    argv = sys.argv[1:]
    if "--" not in argv or not argv[0] or argv[0].startswith("-"):
        sys.exit("usage: llamacpp_convert.py LLAMA_CPP_DIR [--vocab-pre NAME] -- CONVERTER ARGS...")
    sep = argv.index("--")
    llama, opts, conv_args = argv[0], argv[1:sep], argv[sep + 1:]
    pre = opts[1] if len(opts) == 2 and opts[0] == "--vocab-pre" else None
    if opts and pre is None:
        sys.exit(f"llamacpp_convert.py: unknown options {opts}")
    conv = os.path.join(llama, "convert_hf_to_gguf.py")
    if not os.path.isfile(conv):
        sys.exit(f"llamacpp_convert.py: {conv}: not found (expected llama.cpp's converter there)")
    sys.path[:0] = [llama, os.path.join(llama, "gguf-py")]
    if pre:
        from conversion import base

        known = base.TextModel.get_vocab_base_pre

        def vocab_pre(self, tokenizer):
            try:
                return known(self, tokenizer)
            except NotImplementedError:
                print(f"llamacpp_convert.py: unknown pre-tokenizer hash, using '{pre}'", file=sys.stderr)
                return pre

        base.TextModel.get_vocab_base_pre = vocab_pre
    sys.argv = [conv] + conv_args
    runpy.run_path(conv, run_name="__main__")


if __name__ == "__main__":
    main()
