"""Measure the embedded target + drafter with dfl on the first N GSM8K test questions.

    python tools/train/measure.py [--target models/target] [--drafter models/drafter] [--n 100]
                                  [--max-new 256] [--out build/train/measure.json] [--no-hf]

For each question (ChatML, `--chat chatml`): dfl greedy (autoregressive) and dfl speculative
(chain, block 16) are run back to back; the speculative output must equal the greedy one. Then
transformers (AutoModelForCausalLM, float32, eager attention, greedy generate with the checkpoint's
eos ids) answers the same questions and its tokens are compared with dfl's, token for token.
Reports: three greedy answers; tau at B=16 both as the mean of per-response tau and token-weighted
(sum of tokens committed by rounds / rounds); per-position acceptance (fraction of rounds in which
draft k was accepted); speedup = autoregressive decode time per token / speculative decode time per
token (dfl, same prompts, same max tokens; prefill excluded, also reported with prefill included).
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from train_drafter import dfl_generate  # noqa: E402


def spec_summary(results, block):
    rounds = [r["spec"]["stats"]["acceptance_lengths"] for r in results]
    per_resp = [sum(a) / len(a) for a in rounds if a]
    all_r = [x for a in rounds for x in a]
    per_pos = [sum(1 for x in all_r if x - 1 >= k) / len(all_r) for k in range(1, block)]
    hist = [sum(1 for x in all_r if x - 1 == k) for k in range(block)]
    return {"tau_mean_per_response": sum(per_resp) / len(per_resp), "tau_token_weighted": sum(all_r) / len(all_r),
            "rounds": len(all_r), "per_position_acceptance": [round(p, 4) for p in per_pos], "accept_hist": hist}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=os.path.join(common.SOURCE, "models", "target"))
    ap.add_argument("--drafter", default=os.path.join(common.SOURCE, "models", "drafter"))
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--out", default=os.path.join(common.WORK, "measure.json"))
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    args = ap.parse_args()
    rows = common.read_jsonl(common.GSM8K_TEST, args.n)
    t0 = time.time()
    results = []
    for i, ex in enumerate(rows):
        g = dfl_generate(args.target, ex["question"], args.max_new)
        s = dfl_generate(args.target, ex["question"], args.max_new, drafter=args.drafter)
        results.append({"question": ex["question"], "greedy": g, "spec": s})
        if (i + 1) % 10 == 0:
            common.log(f"dfl {i + 1}/{len(rows)} {time.time() - t0:.0f}s")
    dfl_s = time.time() - t0
    block = results[0]["spec"]["stats"]["block_size"]
    lossless = sum(r["greedy"]["tokens"] == r["spec"]["tokens"] for r in results)
    ar_tok = sum(r["greedy"]["stats"]["generated_tokens"] - 1 for r in results)
    sp_tok = sum(r["spec"]["stats"]["generated_tokens"] - 1 for r in results)
    ar_dec = sum(r["greedy"]["stats"]["decode_s"] for r in results)
    sp_dec = sum(r["spec"]["stats"]["decode_s"] for r in results)
    ar_all = sum(r["greedy"]["stats"]["decode_s"] + r["greedy"]["stats"]["prefill_s"] for r in results)
    sp_all = sum(r["spec"]["stats"]["decode_s"] + r["spec"]["stats"]["prefill_s"] for r in results)
    ar_n = sum(r["greedy"]["stats"]["generated_tokens"] for r in results)
    sp_n = sum(r["spec"]["stats"]["generated_tokens"] for r in results)
    summary = {"n": len(rows), "max_new": args.max_new, "block_size": block,
               "generated_tokens": ar_n, "mean_tokens": ar_n / len(rows),
               "stops": {k: sum(r["greedy"]["stats"]["stop"] == k for r in results)
                         for k in {r["greedy"]["stats"]["stop"] for r in results}},
               "spec_equals_greedy": f"{lossless}/{len(rows)}",
               **spec_summary(results, block),
               "ar_decode_tokens_per_s": ar_tok / ar_dec, "spec_decode_tokens_per_s": sp_tok / sp_dec,
               "speedup_decode": (ar_dec / ar_tok) / (sp_dec / sp_tok),
               "speedup_with_prefill": (ar_all / ar_n) / (sp_all / sp_n),
               "samples": [{"question": r["question"], "answer": r["greedy"]["text"]} for r in results[:3]],
               "dfl_wall_s": round(dfl_s, 1)}

    if not args.no_hf:
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        torch.set_num_threads(1)
        t1 = time.time()
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        gc = GenerationConfig.from_pretrained(args.target)
        tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
        same, first_diff = 0, []
        for i, r in enumerate(results):
            ids = torch.tensor([tok.encode(common.chat_prompt(r["question"])).ids])
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=args.max_new, do_sample=False, eos_token_id=gc.eos_token_id,
                                     pad_token_id=gc.pad_token_id)
            hf = out[0, ids.shape[1]:].tolist()
            r["hf_tokens"] = hf
            if hf == r["greedy"]["tokens"]:
                same += 1
            else:
                d = next((k for k, (a, b) in enumerate(zip(hf, r["greedy"]["tokens"])) if a != b),
                         min(len(hf), len(r["greedy"]["tokens"])))
                first_diff.append({"question": i, "first_diff_at": d, "hf_len": len(hf),
                                   "dfl_len": len(r["greedy"]["tokens"])})
        summary.update({"hf_equals_dfl_greedy": f"{same}/{len(results)}", "hf_mismatches": first_diff,
                        "hf_wall_s": round(time.time() - t1, 1)})

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "results": results}, f, indent=1)
    for s in summary["samples"]:
        print(f"Q: {s['question']}\nA: {s['answer']}\n")
    for k, v in summary.items():
        if k != "samples":
            print(f"{k}: {json.dumps(v)}")


if __name__ == "__main__":
    main()
