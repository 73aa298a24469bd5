"""The embedded default models (models/target, models/drafter; tools/train/README.md):

- `dfl inspect` identifies the target as a vision-language Qwen3.5 checkpoint (text tensors under
  model.language_model., vision and mtp tensors present and unused) and the drafter as a DFlash
  drafter that fits the target (block 16, its target_layer_ids);
- dfl's greedy output equals transformers' (AutoModelForCausalLM, float32, eager) on the first
  GSM8K test questions, token for token;
- speculative decoding with the drafter gives exactly the greedy output;
- the drafter's chain tau at block 16 on those questions is at least TAU_FLOOR (measured 5-question
  value minus a margin), and the same drafter cut off from the target's features falls below it —
  so the floor is a real check;
- with DFL_ACT=bf16 (where the CPU has AVX-512 BF16): every layer and the logits within 1e-2 of
  transformers' float32 forward and closer to it than transformers' own bfloat16 forward, and
  speculative decoding (chain and DDTree) equal to greedy decoding in that mode, token for token."""
import json
import os
import shutil
import tempfile

import torch

from dfltest import DATA, SOURCE, Tally, dfl, reference

TARGET = os.path.join(SOURCE, "models", "target")
DRAFTER = os.path.join(SOURCE, "models", "drafter")
N_QUESTIONS = 5
MAX_NEW = 128
TAU_FLOOR = 6.0  # measured 7.38 on these 5 questions with --max-new 128 (models/drafter/README.md)
ENV = dict(os.environ, OMP_NUM_THREADS="1")  # tiny model: one thread is fastest on shared cores
t = Tally("embedded models")


def questions():
    with open(os.path.join(DATA, "datasets", "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        return [json.loads(next(f))["question"] for _ in range(N_QUESTIONS)]


def gen(q, drafter=None):
    extra = ["--drafter", drafter] if drafter else []
    p = dfl("generate", "--target", TARGET, "--prompt", q, "--chat", "chatml", "--max-new", MAX_NEW, "--json",
            *extra, env=ENV)
    return json.loads(p.stdout)


def test_inspect():
    info = json.loads(dfl("inspect", TARGET, "--json", env=ENV).stdout)
    t.check(info["layout"] == "vlm" and info["prefix"] == "model.language_model.",
            f"target layout {info['layout']} prefix {info['prefix']}")
    t.check(info["architecture"] == "qwen3_5" and info["layer_pattern"] == "LLLFLLLF", "target architecture")
    t.check(info["tensors"]["vision"] > 0 and info["tensors"]["mtp"] > 0, f"vision/mtp tensors {info['tensors']}")
    d = json.loads(dfl("inspect", DRAFTER, "--target", TARGET, "--json", env=ENV).stdout)
    t.check(d["layout"] == "drafter" and d["compatible"] is True, f"drafter fit: {d.get('incompatibility')}")
    t.check(d["block_size"] == 16 and d["target_layer_ids"] == [1, 3, 5, 6], "drafter block / target layers")


def tau_of(runs):
    rounds = [x for r in runs for x in r["stats"]["acceptance_lengths"]]
    return sum(rounds) / len(rounds)


def test_generation():
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32, attn_implementation="eager").eval()
    gc = GenerationConfig.from_pretrained(TARGET)
    tok = Tokenizer.from_file(os.path.join(TARGET, "tokenizer.json"))
    specs = []
    for i, q in enumerate(questions()):
        greedy = gen(q)
        ids = torch.tensor([tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n").ids])
        t.check(ids.shape[1] == greedy["stats"]["prompt_tokens"], f"q{i}: prompt tokenization differs")
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=gc.eos_token_id,
                                 pad_token_id=gc.pad_token_id)
        hf = out[0, ids.shape[1]:].tolist()
        t.check(hf == greedy["tokens"], f"q{i}: dfl greedy != transformers greedy\n  dfl {greedy['tokens']}\n  hf  {hf}")
        spec = gen(q, DRAFTER)
        t.check(spec["tokens"] == greedy["tokens"], f"q{i}: speculative output != greedy")
        specs.append(spec)
    # DDTree-4 with block 16: drafts 1..4 can be proposed, 5..15 never: null, not an acceptance rate of 0
    p = dfl("generate", "--target", TARGET, "--drafter", DRAFTER, "--tree-budget", 4, "--prompt", questions()[0],
            "--chat", "chatml", "--max-new", 32, "--json", env=ENV)
    pp = json.loads(p.stdout)["stats"]["per_position"]
    t.check(len(pp) == 15 and all(x is None for x in pp[4:]) and all(x is not None for x in pp[:1]),
            f"ddtree-4 per_position: never-proposed positions null: {pp}")
    tau = tau_of(specs)
    print(f"drafter tau (token-weighted, B=16) on {N_QUESTIONS} questions: {tau:.3f} (floor {TAU_FLOOR})", flush=True)
    t.check(tau >= TAU_FLOOR, f"drafter tau {tau:.3f} < floor {TAU_FLOOR}")

    # negative control: the same drafter cut off from the target's features (fc zeroed) must fall
    # below the floor (it drops to ~1.2), so the floor really tests the drafter
    from safetensors.torch import load_file, save_file
    tmp = tempfile.mkdtemp(prefix="dfl-embedded-")
    try:
        bad = os.path.join(tmp, "drafter")
        shutil.copytree(DRAFTER, bad)
        w = load_file(os.path.join(bad, "model.safetensors"))
        w["fc.weight"].zero_()
        save_file(w, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
        bad_tau = tau_of([gen(q, bad) for q in questions()])
        print(f"broken drafter (no target context) tau: {bad_tau:.3f}", flush=True)
        t.check(bad_tau < TAU_FLOOR, f"a broken drafter still reaches tau {bad_tau:.3f} >= floor {TAU_FLOOR}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_bf16_activations():
    bf = dict(ENV, DFL_ACT="bf16")
    if "act bf16" not in dfl("--version", env=bf).stdout:
        print("bf16 activations: this CPU has no AVX-512 BF16; not checked", flush=True)
        return
    from safetensors.numpy import load_file
    tmp = tempfile.mkdtemp(prefix="dfl-act-")
    try:
        worst = {}
        for dt in ("float32", "bfloat16"):
            reference("--model", TARGET, "--prompt", questions()[0], "--dtype", dt,
                      "--out", os.path.join(tmp, f"ref-{dt}.safetensors"))
        ref = os.path.join(tmp, "ref-float32.safetensors")
        ids = ",".join(str(int(x)) for x in load_file(ref)["input_ids"])
        out = os.path.join(tmp, "dfl-bf16.safetensors")
        dfl("hidden", "--target", TARGET, "--layers", "all", "--prompt-ids", ids, "--out", out, "--logits", env=bf)
        for name, path in (("dfl bf16 activations", out), ("transformers bfloat16", os.path.join(tmp, "ref-bfloat16.safetensors"))):
            d = json.loads(dfl("hidden-diff", path, ref, "--tol", 1, "--json").stdout)
            worst[name] = max(x["rel"] for x in d["tensors"] if x["name"].startswith(("layer.", "logits")))
            print(f"{name} vs transformers float32: worst relative difference over layers and logits "
                  f"{worst[name]:.3g}", flush=True)
        t.check(worst["dfl bf16 activations"] <= 1e-2, f"bf16 activations: worst rel {worst['dfl bf16 activations']:.3g} > 1e-2")
        t.check(worst["dfl bf16 activations"] < worst["transformers bfloat16"],
                "bf16 activations should stay closer to float32 than a bfloat16 forward: "
                f"{worst['dfl bf16 activations']:.3g} vs {worst['transformers bfloat16']:.3g}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    same_as_f32 = 0
    for i, q in enumerate(questions()):
        args = ("generate", "--target", TARGET, "--prompt", q, "--chat", "chatml", "--max-new", MAX_NEW, "--json")
        p = dfl(*args, env=bf)
        greedy = json.loads(p.stdout)["tokens"]
        t.check(json.loads(p.stdout)["stats"]["activations"] == "bf16", "generate --json stats: activations bf16")
        t.check("bf16 activations (DFL_ACT=bf16)" in p.stderr, f"generate says it runs with bf16 activations: {p.stderr}")
        chain = json.loads(dfl(*args, "--drafter", DRAFTER, env=bf).stdout)["tokens"]
        t.check(chain == greedy, f"q{i}: bf16 activations: speculative (chain) output != greedy")
        if i < 2:
            tree = json.loads(dfl(*args, "--drafter", DRAFTER, "--tree-budget", 8, env=bf).stdout)["tokens"]
            t.check(tree == greedy, f"q{i}: bf16 activations: speculative (DDTree-8) output != greedy")
        same_as_f32 += greedy == gen(q)["tokens"]
    print(f"bf16 activations: greedy output equals the float32 one on {same_as_f32}/{N_QUESTIONS} questions", flush=True)


t.run(test_inspect)
t.run(test_generation)
t.run(test_bf16_activations)
t.done()
