"""dfl serve driven by the clients people point at it (issue 22): lm-evaluation-harness's
`local-completions` model running a local multiple-choice (loglikelihood) task, and the official
`openai` Python package (completions with logprobs and echo, chat with logprobs, streaming).

lm-eval's per-choice loglikelihoods and greedy flags are checked against transformers on the same
checkpoint (the embedded target, float32): for each (context, continuation) lm-eval splits the
tokens as its `_encode_pair` does, and the reference sums log_softmax over the continuation tokens.
The task's data is a local JSON-lines file (no hub: HF_DATASETS_OFFLINE / HF_HUB_OFFLINE). lm-eval
runs twice: --batch_size 1 (one prompt per request) and 4 (a list of prompts per request)."""
import glob
import json
import os
import re
import subprocess
import tempfile
import threading
import time

import torch

from dfltest import DFL, PY, SOURCE, Tally

t = Tally("clients")
tmp = tempfile.mkdtemp(prefix="dfl-clients-")
TARGET = os.path.join(SOURCE, "models", "target")

QUESTIONS = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?", [" 72", " 96", " 24"], 0),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
     "How much did she earn?", [" $10", " $12", " $600"], 0),
    ("James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
     [" 624", " 312", " 52"], 0),
]


class Server:
    def __init__(self):
        self.p = subprocess.Popen([DFL, "serve", "--target", TARGET, "--port", "0", "--quiet"],
                                  stderr=subprocess.PIPE, text=True)
        self.port, log, deadline = None, [], time.time() + 120
        while time.time() < deadline and not self.port:
            line = self.p.stderr.readline()
            if not line:
                break
            log.append(line)
            m = re.search(r"listening on http://[^ ]*:(\d+)", line)
            self.port = int(m.group(1)) if m else None
        if not self.port:
            self.p.kill()
            raise AssertionError("dfl serve did not start: " + "".join(log))
        threading.Thread(target=lambda: [None for _ in iter(self.p.stderr.readline, "")], daemon=True).start()

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=60)


def reference_loglikelihoods(pairs):
    """transformers float32: (sum of continuation logprobs, all greedy) per (context, continuation),
    with lm-eval's split of the tokens (a trailing space of the context moves to the continuation;
    the continuation's ids are those of context + continuation past the context's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TARGET)
    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32, attn_implementation="eager").eval()
    out = []
    for ctx, cont in pairs:
        n_space = len(ctx) - len(ctx.rstrip())
        if n_space:
            ctx, cont = ctx[:-n_space], ctx[-n_space:] + cont
        whole = tok.encode(ctx + cont, add_special_tokens=False)
        n_ctx = len(tok.encode(ctx, add_special_tokens=False))
        with torch.no_grad():
            logits = model(torch.tensor([whole])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        total, greedy = 0.0, True
        for i in range(n_ctx, len(whole)):
            total += lp[i - 1, whole[i]].item()
            greedy &= int(lp[i - 1].argmax()) == whole[i]
        out.append((total, greedy))
    return out


def http_requests(srv):
    """Answered POST /v1/completions (status 200) so far, from /metrics."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=60).read().decode()
    m = re.search(r'^dfl_http_requests_total\{endpoint="/v1/completions",status="200"\} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


def lm_eval(srv, batch_size):
    """lm-eval's loglikelihood requests; --batch_size 4 sends a list of 4 token-id prompts per
    request (one choice per prompt, matched back by `index`)."""
    data = os.path.join(tmp, "mc.jsonl")
    with open(data, "w") as f:
        for q, choices, a in QUESTIONS:
            f.write(json.dumps({"question": q, "choices": choices, "answer": a}) + "\n")
    with open(os.path.join(tmp, "dfl_mc.yaml"), "w") as f:
        f.write("task: dfl_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + data + "\n"
                "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
                "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\n"
                "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    out = os.path.join(tmp, f"lm-eval-out-b{batch_size}")
    args = ("model=target,base_url=http://127.0.0.1:%d/v1/completions,tokenizer_backend=huggingface,tokenizer=%s,"
            "tokenized_requests=True,num_concurrent=1,max_retries=1" % (srv.port, TARGET))
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    before = http_requests(srv)
    p = subprocess.run([PY, "-m", "lm_eval", "--model", "local-completions", "--tasks", "dfl_mc", "--include_path",
                        tmp, "--batch_size", str(batch_size), "--model_args", args, "--output_path", out,
                        "--log_samples"],
                       capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    t.check(p.returncode == 0, f"lm_eval exited {p.returncode}: {p.stderr[-1500:]}")
    # 9 loglikelihoods: 9 requests one by one, 3 (4 + 4 + 1 prompts) in batches of 4
    sent = http_requests(srv) - before
    t.check(sent == (9 + batch_size - 1) // batch_size, f"lm-eval --batch_size {batch_size} sent {sent} requests")
    samples = glob.glob(os.path.join(out, "*", "samples_dfl_mc_*.jsonl"))
    t.check(len(samples) == 1, f"lm_eval wrote its samples: {samples}")
    if len(samples) != 1:
        return
    rows = [json.loads(x) for x in open(samples[0])]
    t.check(len(rows) == len(QUESTIONS), f"{len(rows)} documents scored, expected {len(QUESTIONS)}")
    pairs, got = [], []
    for r in rows:
        for k in sorted(r["arguments"], key=lambda s: int(s.rsplit("_", 1)[1])):
            pairs.append((r["arguments"][k]["arg_0"], r["arguments"][k]["arg_1"]))
        for resp in r["filtered_resps"]:
            got.append((float(resp[0]), resp[1] in (True, "True")))
    ref = reference_loglikelihoods(pairs)
    worst = max(abs(a[0] - b[0]) for a, b in zip(got, ref))
    t.check(len(got) == len(ref) == 9 and worst < 1e-3,
            f"lm-eval --batch_size {batch_size}: loglikelihoods through dfl serve vs transformers: worst |diff| "
            f"{worst:.2e} over {len(got)}")
    t.check(all(a[1] == b[1] for a, b in zip(got, ref)), f"greedy flags: {[(a[1], b[1]) for a, b in zip(got, ref)]}")
    res = json.load(open(glob.glob(os.path.join(out, "*", "results_*.json"))[0]))
    acc = res["results"]["dfl_mc"]["acc,none"]
    want = sum(max(range(3), key=lambda c: ref[3 * i + c][0]) == a for i, (_, _, a) in enumerate(QUESTIONS)) / 3
    t.check(abs(acc - want) < 1e-9, f"lm-eval acc {acc} vs the reference's argmax choices {want}")


def openai_client(srv):
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.completions.create(model="target", prompt="Question: 2 + 3 = ?\nAnswer:", max_tokens=8, temperature=0,
                                  logprobs=3, echo=True)
    lp = r.choices[0].logprobs
    t.check(r.choices[0].text.startswith("Question: 2 + 3 = ?\nAnswer:") and lp.token_logprobs[0] is None
            and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
            and r.usage.completion_tokens == 8,
            f"openai completions, echo + logprobs 3: {str(r)[:600]}")
    gen = lp.token_logprobs[-8:]
    t.check(all(x is not None and x <= 0 for x in gen) and all(len(d) >= 3 for d in lp.top_logprobs[-8:]),
            f"openai completions: generated logprobs and 3 alternatives: {gen}")
    # greedy: the chosen token is its position's most likely one
    t.check(all(abs(max(d.values()) - x) < 1e-5 for d, x in zip(lp.top_logprobs[-8:], gen)),
            "openai completions at temperature 0: each generated token is its position's top-1")
    c = client.chat.completions.create(model="target", messages=[{"role": "user", "content": "Say hi."}],
                                       max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    t.check(len(content) == c.usage.completion_tokens and all(len(x.top_logprobs) == 2 for x in content),
            f"openai chat, logprobs + top_logprobs 2: {str(c)[:600]}")
    text = "".join(ch.choices[0].text for ch in client.completions.create(
        model="target", prompt="Question: 2 + 3 = ?\nAnswer:", max_tokens=8, temperature=0, stream=True))
    plain = client.completions.create(model="target", prompt="Question: 2 + 3 = ?\nAnswer:", max_tokens=8,
                                      temperature=0)
    t.check(text == plain.choices[0].text, f"openai streamed text {text!r} vs not streamed {plain.choices[0].text!r}")
    try:
        client.completions.create(model="target", prompt="x", max_tokens=2, logprobs=21)
        t.check(False, "logprobs 21 accepted")
    except Exception as e:  # noqa: BLE001 - the client raises BadRequestError
        t.check(getattr(e, "status_code", None) == 400 and "logprobs" in str(e), f"logprobs 21: {e}")


srv = Server()
try:
    t.run(lm_eval, srv, 1)
    t.run(lm_eval, srv, 4)
    t.run(openai_client, srv)
finally:
    srv.stop()
t.done()
