"""`dfl eval --protocol zlab` builds the prompts of z-lab's dflash benchmark token for token.

The reference is the dflash package's own code (dflash/benchmark.py): DATASETS[name]["format"],
_select_dataset (random.Random(42).shuffle, the first max_samples), apply_chat_template(tokenizer,
messages, "off") and tokenizer.encode(..., add_special_tokens=False), with the real Qwen3 tokenizer
and chat template from data/tokenizers/qwen3. dfl's side is `--dump-prompts FILE` (a JSON line
per prompt and turn with its token ids).

- load_and_process_dataset needs the network (datasets.load_dataset): the rows are built from the
  local JSON lines instead (data/datasets: gsm8k test.jsonl as {"question"}, MT-Bench
  question.jsonl as HuggingFaceH4/mt_bench_prompts' {"prompt": [turn 1, turn 2]}), and for
  math500, humaneval and mbpp (no local copies) from a few synthetic rows with those datasets'
  fields. That the local files list the rows in the Hub's order is assumed, not checked here.
- benchmark.py imports `requests` at the top (only its OpenAI backend uses it); it is not in the
  venv, so an empty stand-in module is registered before the import.
- MT-Bench second turns: dfl builds them on the model's own first answer. Without a model
  (`--dump-prompts` without --drafter) `--dump-answer TEXT` gives a fixed answer, and the reference
  puts the same text in the assistant message (also one with a think block, which Qwen3's template
  drops from an earlier turn). With a model (the embedded pair, its own tokenizer and Qwen3's
  template) the dumped answer must be the HF decode (skip_special_tokens=True) of the first turn's
  output ids, as the benchmark makes it, and the second prompt dflash's rendering of it.
"""
import json
import os
import sys
import tempfile
import types

from dfltest import DATA, SOURCE, Tally, dfl

sys.modules.setdefault("requests", types.ModuleType("requests"))  # see the docstring
from dflash.benchmark import DATASETS, _select_dataset, apply_chat_template  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

t = Tally("protocol")
tmp = tempfile.mkdtemp(prefix="dfl-protocol-")
QWEN3 = os.path.join(DATA, "tokenizers", "qwen3")
GSM8K = os.path.join(DATA, "datasets", "gsm8k", "test.jsonl")
MTBENCH = os.path.join(DATA, "datasets", "mt_bench", "question.jsonl")
tok = AutoTokenizer.from_pretrained(QWEN3)
ANSWER = "Here is my answer.\n\n**Aloha!** It ends with a space "
THINK_ANSWER = "<think>\nsome thoughts\n</think>\n\nThe answer after the think block."


def jsonl(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def reference(rows, name, limit, answer=None, tokenizer=tok):
    """The benchmark's prompts: [(turn, text, ids)] in its order."""
    cfg = DATASETS[name]
    dataset = [{"turns": cfg["format"](r) if cfg.get("multi_turn") else [cfg["format"](r)]} for r in rows]
    out = []
    for inst in _select_dataset(dataset, limit):
        messages = []
        for turn, user in enumerate(inst["turns"]):
            if turn and answer is None:
                break
            if turn:
                messages.append({"role": "assistant", "content": answer})
            messages.append({"role": "user", "content": user})
            text = apply_chat_template(tokenizer, messages, "off")
            out.append((turn, text, tokenizer.encode(text, add_special_tokens=False)))
    return out


def dumped(path):
    return [(d["turn"], d["text"], d["ids"]) for d in jsonl(path)]


def same(name, got, want):
    t.check(len(got) == len(want), f"{name}: {len(got)} prompts dumped, the benchmark has {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if not t.check(g[0] == w[0] and g[2] == w[2], f"{name}: prompt {i} (turn {w[0] + 1}) differs"):
            print(f"  dfl:       {g[1]!r}\n  benchmark: {w[1]!r}")
            return
        t.check(g[1] == w[1], f"{name}: prompt {i}: the same ids from different text")


def dump(prompts, *extra, tokenizer=QWEN3):
    out = os.path.join(tmp, f"dump{len(os.listdir(tmp))}.jsonl")
    dfl("eval", "--protocol", "zlab", "--prompts", prompts, "--tokenizer", tokenizer, "--dump-prompts", out, *extra)
    return dumped(out)


def gsm8k():
    rows = jsonl(GSM8K)
    same("gsm8k, all 1319", dump(GSM8K), reference(rows, "gsm8k", None))
    same("gsm8k --limit 40", dump(GSM8K, "--limit", 40), reference(rows, "gsm8k", 40))
    same("gsm8k --format gsm8k", dump(GSM8K, "--limit", 5, "--format", "gsm8k"), reference(rows, "gsm8k", 5))


def mtbench():
    rows = [{"prompt": q["turns"]} for q in jsonl(MTBENCH)]  # mt_bench_prompts' shape
    same("mt-bench first turns", dump(MTBENCH), reference(rows, "mt-bench", None))
    for ans in (ANSWER, THINK_ANSWER):
        same(f"mt-bench both turns, answer {ans[:12]!r}", dump(MTBENCH, "--dump-answer", ans),
             reference(rows, "mt-bench", None, answer=ans))
    same("mt-bench --limit 7, --protocol-dataset", dump(MTBENCH, "--limit", 7, "--protocol-dataset", "mt-bench",
                                                        "--dump-answer", ANSWER),
         reference(rows, "mt-bench", 7, answer=ANSWER))


def synthetic():
    """math500, humaneval, mbpp: rows with those datasets' fields, the dataset told by them."""
    sets = {
        "math500": [{"problem": f"Compute $\\frac{{{i}}}{{7}} + {i}^2$.", "solution": "x", "answer": str(i),
                     "subject": "Algebra", "level": 2, "unique_id": f"test/algebra/{i}.json"} for i in range(23)],
        "humaneval": [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n",
                       "canonical_solution": f"    return x + {i}\n", "test": "def check(c): pass",
                       "entry_point": f"f{i}"} for i in range(17)],
        "mbpp": [{"source_file": "x.py", "task_id": 11 + i, "prompt": f"Write a function to add {i} to a number.",
                  "code": "def f(x): pass", "test_imports": [], "test_list": ["assert True"]} for i in range(29)],
    }
    for name, rows in sets.items():
        path = os.path.join(tmp, f"{name}.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        same(name, dump(path), reference(rows, name, None))
        same(f"{name} --limit 5", dump(path, "--limit", 5, "--protocol-dataset", name), reference(rows, name, 5))


def real_run():
    """The embedded pair on MT-Bench: second turns built on the model's own answers."""
    et, ed = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
    etok = PreTrainedTokenizerFast.from_pretrained(et)
    etok.chat_template = tok.chat_template  # Qwen3's template on the embedded model's vocabulary
    out, dp = os.path.join(tmp, "run"), os.path.join(tmp, "run-prompts.jsonl")
    dfl("eval", "--target", et, "--drafter", ed, "--protocol", "zlab", "--prompts", MTBENCH, "--limit", 3,
        "--max-new", 24, "--out", out, "--dump-prompts", dp, "--cost-reps", 0, "--progress", "none")
    d = jsonl(dp)
    t.check(len(d) == 6, f"run: {len(d)} prompts dumped, want 3 x 2 turns")
    res = jsonl(os.path.join(out, "results.jsonl"))
    rows = [{"prompt": q["turns"]} for q in jsonl(MTBENCH)]
    sel = _select_dataset([{"turns": r["prompt"]} for r in rows], 3)
    for k, inst in enumerate(sel):
        first = [x for x in d if x["index"] == k and x["turn"] == 0]
        second = [x for x in d if x["index"] == k and x["turn"] == 1]
        if not t.check(len(first) == 1 and len(second) == 1, f"run: prompt {k}: both turns dumped"):
            continue
        first, second = first[0], second[0]
        msgs = [{"role": "user", "content": inst["turns"][0]}]
        want1 = etok.encode(apply_chat_template(etok, msgs, "off"), add_special_tokens=False)
        t.check(first["ids"] == want1, f"run: prompt {k} turn 1 ids")
        outs = [r for r in res if r["prompt_id"] == first["prompt_id"] and r["turn"] == 0 and r.get("output_ids")]
        if t.check(outs, f"run: prompt {k}: output ids of turn 1 in results.jsonl"):
            answer = etok.decode(outs[0]["output_ids"], skip_special_tokens=True)
            t.check(second["answer"] == answer, f"run: prompt {k}: the answer is the HF decode of the output ids: "
                                                f"{second['answer']!r} vs {answer!r}")
        msgs += [{"role": "assistant", "content": second["answer"]}, {"role": "user", "content": inst["turns"][1]}]
        text = apply_chat_template(etok, msgs, "off")
        t.check(second["text"] == text, f"run: prompt {k} turn 2 text:\n{second['text']!r}\n{text!r}")
        t.check(second["ids"] == etok.encode(text, add_special_tokens=False), f"run: prompt {k} turn 2 ids")
    with open(os.path.join(out, "summary.json")) as f:
        p = json.load(f).get("protocol", {})
    want = {"name": "zlab", "dataset": "mt-bench", "shuffle_seed": 42, "max_samples": 3, "selected": 3,
            "chat": "qwen3, thinking off", "max_new": 24, "max_new_default": 2048, "tau": "tau"}
    t.check(all(p.get(k) == v for k, v in want.items()), f"summary.json protocol: {p}")


def cli():
    r = dfl("eval", "--protocol", "zlab", "--prompts", GSM8K, "--tokenizer", QWEN3, "--dump-prompts",
            os.path.join(tmp, "x.jsonl"), "--chat", "chatml", check=False)
    t.check(r.returncode != 0 and "chatml-nothink" in r.stderr, f"--chat chatml refused: {r.stderr}")
    r = dfl("eval", "--protocol", "zlab", "--prompts", GSM8K, "--tokenizer", QWEN3, "--dump-prompts",
            os.path.join(tmp, "x.jsonl"), "--protocol-dataset", "squad", check=False)
    t.check(r.returncode == 2 and "--protocol-dataset" in r.stderr, f"unknown dataset refused: {r.stderr}")
    odd = os.path.join(tmp, "odd.jsonl")
    with open(odd, "w") as f:
        f.write('{"prompt": "hello"}\n')
    r = dfl("eval", "--protocol", "zlab", "--prompts", odd, "--tokenizer", QWEN3, "--dump-prompts",
            os.path.join(tmp, "x.jsonl"), check=False)
    t.check(r.returncode != 0 and "--protocol-dataset" in r.stderr, f"ambiguous fields: {r.stderr}")
    same("--protocol-dataset mbpp on {prompt}", dump(odd, "--protocol-dataset", "mbpp"),
         reference([{"prompt": "hello"}], "mbpp", None))


t.run(gsm8k)
t.run(mtbench)
t.run(synthetic)
t.run(real_run)
t.run(cli)
t.done()
