"""dfl serve as a process (port 0), driven with the curl command-line client:

- /v1/completions (text and token-id prompts), /v1/chat/completions and /generate give the same
  tokens and text as `dfl generate --json` for the same prompt and options: greedy and seeded
  sampling (top_p / top_k too), with and without a drafter, dense and hybrid targets; a list of
  prompts gives one choice per prompt, in order, each equal to generate's;
- streaming (SSE) reassembles to the same text and ids and ends with [DONE];
- /generate meta_info: spec_verify_ct, spec_accept_length, per-position acceptance and the
  per-round acceptance lengths equal generate's rounds, tau, per_position, acceptance_lengths;
- stop strings end the text right before them (finish_reason "stop");
- /tokenize and /detokenize round trip and agree with `dfl tokenize`;
- /metrics counters (HTTP by endpoint and status, vllm:spec_decode_*) increase as they should;
  every family parses cleanly with prometheus_client (counters typed under their _total names,
  no untyped leftovers), and vLLM's latency histograms count the requests made;
- bad requests get the documented status and a JSON error naming the field (400, 404, 405,
  413, 503 when the queue is full), unsupported fields (logit_bias, response_format, tools,
  unknown ones) included;
- a client disconnecting mid-stream cancels its generation and leaves the server healthy;
- SIGTERM while a stream is in flight: the stream completes, the server exits with status 0."""
import json
import os
import re
import signal
import subprocess
import threading
import time

from dfltest import DFL, Tally, dfl, dfl_json, fixture, reference

t = Tally("serve")
TINY, D3 = fixture("qwen3_tiny"), fixture("dflash_qwen3")
VLM, D35 = fixture("qwen35_vlm"), fixture("dflash_qwen35")


class Server:
    def __init__(self, target, drafter=None, *extra):
        args = [DFL, "serve", "--target", target, "--port", "0", "--quiet", *map(str, extra)]
        if drafter:
            args += ["--drafter", drafter]
        self.p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline:
            line = self.p.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://[^ ]*:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.p.kill()
            raise AssertionError("dfl serve did not start: " + "".join(self.log))
        # keep draining stderr so that the server never blocks on a full pipe
        self.reader = threading.Thread(target=lambda: self.log.extend(iter(self.p.stderr.readline, "")), daemon=True)
        self.reader.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def request(self, path, body=None, method=None, raw=None, headers=False, timeout=120):
        """(status, text body[, headers]) with curl."""
        args = ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", str(timeout)]
        if headers:
            args.append("-i")
        if method:
            args += ["-X", method]
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        if data is not None:
            args += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        p = subprocess.run(args + [self.url + path], input=data, capture_output=True, text=True)
        out, _, code = p.stdout.rpartition("\n")
        return int(code or 0), out

    def json(self, path, body=None, **kw):
        status, out = self.request(path, body, **kw)
        try:
            return status, json.loads(out)
        except ValueError:
            return status, {"raw": out}

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return None


def generate(target, drafter, prompt, max_new, temperature=0.0, seed=0, ignore_eos=False, chat=None, ids=False,
             top_p=None, top_k=None):
    args = ["generate", "--target", target, "--max-new", max_new, "--json", "--temperature", temperature,
            "--seed", seed]
    if top_p is not None:
        args += ["--top-p", top_p]
    if top_k is not None:
        args += ["--top-k", top_k]
    args += ["--prompt-ids", ",".join(map(str, prompt))] if ids else ["--prompt", prompt]
    if drafter:
        args += ["--drafter", drafter]
    if ignore_eos:
        args.append("--ignore-eos")
    if chat:
        args += ["--chat", chat]
    return dfl_json(*args)


def sse(text):
    """Parse an SSE body: (list of JSON events, saw [DONE])."""
    events, done = [], False
    for block in text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[6:]
        if payload == "[DONE]":
            done = True
        else:
            events.append(json.loads(payload))
    return events, done


def metrics(srv):
    status, text = srv.request("/metrics")
    assert status == 200
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


PROMPTS = ["Janet has 3 apples and buys 5 more. How many", "The train leaves at"]


def outputs_match(target, drafter):
    srv = Server(target, drafter)
    tag = f"{os.path.basename(target)}+{os.path.basename(drafter) if drafter else 'AR'}"
    try:
        for prompt in PROMPTS:
            for temp, seed, ign in [(0.0, 0, False), (0.0, 0, True), (0.8, 42, True), (1.0, 7, False)]:
                ref = generate(target, drafter, prompt, 24, temp, seed, ign)
                st, r = srv.json("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": temp,
                                                     "seed": seed, "ignore_eos": ign})
                ch = r.get("choices", [{}])[0]
                what = f"{tag} T={temp} seed={seed} ignore_eos={ign} '{prompt[:20]}'"
                t.check(st == 200 and ch.get("token_ids") == ref["tokens"], f"{what}: tokens {ch.get('token_ids')} "
                        f"vs generate {ref['tokens']}")
                t.check(ch.get("text") == ref["text"], f"{what}: text differs")
                want_finish = "stop" if ref["stats"]["stop"] == "eos" else "length"
                t.check(ch.get("finish_reason") == want_finish, f"{what}: finish {ch.get('finish_reason')}")
                t.check(r.get("usage") == {"prompt_tokens": ref["stats"]["prompt_tokens"], "completion_tokens":
                                           len(ref["tokens"]), "total_tokens": ref["stats"]["prompt_tokens"] +
                                           len(ref["tokens"])}, f"{what}: usage {r.get('usage')}")
                # the same request streamed
                st, body = srv.request("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": temp,
                                                           "seed": seed, "ignore_eos": ign, "stream": True})
                events, done = sse(body)
                text = "".join(e["choices"][0]["text"] for e in events)
                ids = [i for e in events for i in e["choices"][0]["token_ids"]]
                t.check(st == 200 and done and text == ref["text"] and ids == ref["tokens"],
                        f"{what}: stream reassembles to {text!r} / {ids}")
                t.check(events and events[-1]["choices"][0]["finish_reason"] == want_finish,
                        f"{what}: last chunk finish_reason")
        # sampling as served (top_p / top_k): the same tokens as dfl generate with those flags, on the
        # three endpoints; a list of prompts gives one choice per prompt, each equal to generate's
        for top_p, top_k in [(0.95, 20), (0.8, None), (None, 5)]:
            flt = {k: v for k, v in (("top_p", top_p), ("top_k", top_k)) if v is not None}
            ref = generate(target, drafter, PROMPTS[0], 20, 1.0, 11, True, top_p=top_p, top_k=top_k)
            what = f"{tag} T=1 {flt}"
            st, r = srv.json("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 20, "temperature": 1.0,
                                                 "seed": 11, "ignore_eos": True, **flt})
            t.check(st == 200 and r["choices"][0]["token_ids"] == ref["tokens"],
                    f"{what}: completions {r.get('choices', [{}])[0].get('token_ids')} vs generate {ref['tokens']}")
            st, r = srv.json("/generate", {"text": PROMPTS[0], "sampling_params": {
                "max_new_tokens": 20, "temperature": 1.0, "seed": 11, "ignore_eos": True, **flt}})
            t.check(st == 200 and r.get("output_ids") == ref["tokens"], f"{what}: /generate differs")
            ref_chat = generate(target, drafter, PROMPTS[0], 12, 1.0, 11, True, chat="chatml", top_p=top_p,
                                top_k=top_k)
            st, r = srv.json("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}],
                                                      "max_tokens": 12, "temperature": 1.0, "seed": 11,
                                                      "ignore_eos": True, **flt})
            t.check(st == 200 and r["choices"][0]["token_ids"] == ref_chat["tokens"], f"{what}: chat differs")
        refs = [generate(target, drafter, p, 10, 0.7, 3, True, top_p=0.9, top_k=20) for p in PROMPTS]
        st, r = srv.json("/v1/completions", {"prompt": PROMPTS, "max_tokens": 10, "temperature": 0.7, "top_p": 0.9,
                                             "top_k": 20, "seed": 3, "ignore_eos": True})
        ch = r.get("choices", [])
        t.check(st == 200 and [c["index"] for c in ch] == [0, 1] and
                [c["token_ids"] for c in ch] == [x["tokens"] for x in refs] and
                [c["text"] for c in ch] == [x["text"] for x in refs] and
                r["usage"]["completion_tokens"] == 20, f"{tag}: a list of prompts: {st} {r}")
        # token-id prompt, SGLang /generate, stats
        ids = dfl("tokenize", "--tokenizer", target, "--text", PROMPTS[0], "--json").stdout
        ids = json.loads(ids)
        ref = generate(target, drafter, ids, 30, ids=True, ignore_eos=True)
        st, r = srv.json("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 30, "temperature": 0,
                                                                             "ignore_eos": True}})
        mi = r.get("meta_info", {})
        t.check(st == 200 and r.get("output_ids") == ref["tokens"] and r.get("text") == ref["text"],
                f"{tag} /generate output differs")
        t.check(mi.get("prompt_tokens") == len(ids) and mi.get("completion_tokens") == 30 and
                mi.get("finish_reason") == {"type": "length", "length": 30}, f"{tag} meta_info {mi}")
        s = ref["stats"]
        if drafter:
            t.check(mi.get("spec_verify_ct") == s["rounds"], f"{tag}: spec_verify_ct {mi.get('spec_verify_ct')} vs "
                    f"rounds {s['rounds']}")
            t.check(abs(mi.get("spec_accept_length", -1) - s["tau"]) < 1e-5, f"{tag}: spec_accept_length vs tau")
            t.check(len(mi.get("spec_accept_rate_per_pos", [])) == len(s["per_position"]) and
                    all((a is None and b is None) or (a is not None and b is not None and abs(a - b) < 1e-5)
                        for a, b in zip(mi["spec_accept_rate_per_pos"], s["per_position"])),
                    f"{tag}: per-position acceptance {mi.get('spec_accept_rate_per_pos')} vs {s['per_position']}")
            t.check(mi.get("spec_accept_lengths") == s["acceptance_lengths"] and
                    mi.get("spec_accept_histogram") == s["accept_hist"], f"{tag}: acceptance lengths differ")
            t.check(mi.get("spec_draft_tokens") == s["drafted"] and mi.get("spec_accepted_tokens") == s["accepted"],
                    f"{tag}: drafted/accepted")
        else:
            t.check(mi.get("spec_verify_ct") == 29 and mi.get("spec_accept_length") == 1.0,
                    f"{tag}: autoregressive meta_info {mi}")
        # SGLang streaming: every chunk carries the cumulative text and ids
        st, body = srv.request("/generate", {"input_ids": ids, "stream": True, "sampling_params": {
                               "max_new_tokens": 30, "temperature": 0, "ignore_eos": True}})
        events, done = sse(body)
        t.check(st == 200 and done and events[-1]["text"] == ref["text"] and events[-1]["output_ids"] == ref["tokens"]
                and events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 30} and
                all(e["meta_info"]["finish_reason"] is None for e in events[:-1]), f"{tag}: /generate stream")
        # seeded sampling through /generate text
        ref = generate(target, drafter, PROMPTS[1], 16, 0.9, 1234, True)
        st, r = srv.json("/generate", {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 16,
                                       "temperature": 0.9, "seed": 1234, "ignore_eos": True}})
        t.check(st == 200 and r.get("output_ids") == ref["tokens"], f"{tag}: seeded /generate differs")
        # chat: one user turn = generate --chat chatml
        ref = generate(target, drafter, PROMPTS[0], 20, ignore_eos=True, chat="chatml")
        st, r = srv.json("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}],
                                                  "max_tokens": 20, "temperature": 0, "ignore_eos": True})
        ch = r.get("choices", [{}])[0]
        t.check(st == 200 and ch.get("token_ids") == ref["tokens"] and
                ch.get("message") == {"role": "assistant", "content": ref["text"]}, f"{tag}: chat differs: {r}")
        st, body = srv.request("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}],
                               "max_tokens": 20, "temperature": 0, "ignore_eos": True, "stream": True,
                               "stream_options": {"include_usage": True}})
        events, done = sse(body)
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        t.check(st == 200 and done and events[0]["choices"][0]["delta"].get("role") == "assistant" and
                text == ref["text"] and events[-1].get("usage", {}).get("completion_tokens") == 20,
                f"{tag}: chat stream differs")
    finally:
        t.check(srv.stop() == 0, f"{tag}: server exit status")
    print(f"{tag}: outputs match dfl generate", flush=True)


def stops_tokenize_metrics():
    srv = Server(TINY, D3, "--max-body", 65536, "--max-context", 256)
    try:
        ref = generate(TINY, D3, PROMPTS[0], 40, ignore_eos=True)
        text = ref["text"]
        m = re.search(r"[A-Za-z]{3}", text[len(text) // 3:])
        if t.check(m is not None, f"no ASCII word in {text!r}"):
            stop = m.group(0)
            cut = text.index(stop)
            for stream in (False, True):
                body = {"prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                        "stop": ["\x01never", stop], "stream": stream}
                if stream:
                    st, out = srv.request("/v1/completions", body)
                    events, _ = sse(out)
                    got = "".join(e["choices"][0]["text"] for e in events)
                    fin = events[-1]["choices"][0]
                else:
                    st, r = srv.json("/v1/completions", body)
                    fin = r["choices"][0]
                    got = fin["text"]
                t.check(st == 200 and got == text[:cut] and fin["finish_reason"] == "stop" and
                        fin.get("stop_reason") == stop, f"stop {stop!r} (stream={stream}): got {got!r}")
            st, r = srv.json("/generate", {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 40,
                             "temperature": 0, "ignore_eos": True, "stop": stop}})
            t.check(st == 200 and r["text"] == text[:cut] and
                    r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}, f"/generate stop: {r}")
        # tokenize / detokenize
        s = "Janet's ducks lay 16 eggs per day. <|im_end|>"
        st, r = srv.json("/tokenize", {"text": s})
        want = json.loads(dfl("tokenize", "--tokenizer", TINY, "--text", s, "--json").stdout)
        t.check(st == 200 and r.get("tokens") == want and r.get("count") == len(want), f"/tokenize {r} vs {want}")
        st, r2 = srv.json("/detokenize", {"tokens": want})
        t.check(st == 200 and r2.get("text") == s, f"/detokenize round trip: {r2}")
        st, r3 = srv.json("/tokenize", {"prompt": s})
        t.check(st == 200 and r3.get("tokens") == want, "/tokenize with 'prompt'")
        # metrics
        before = metrics(srv)
        st, r = srv.json("/generate", {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 12,
                                                                             "temperature": 0, "ignore_eos": True}})
        after = metrics(srv)
        mi = r["meta_info"]
        key = '{model_name="qwen3_tiny"}'

        def delta(name):
            return after.get(name, 0) - before.get(name, 0)

        t.check(delta('dfl_http_requests_total{endpoint="/generate",status="200"}') == 1, "http counter +1")
        t.check(delta("vllm:generation_tokens_total" + key) == 12, "generation tokens +12")
        t.check(delta("vllm:spec_decode_num_draft_tokens_total" + key) == mi["spec_draft_tokens"] and
                delta("vllm:spec_decode_num_accepted_tokens_total" + key) == mi["spec_accepted_tokens"] and
                delta("dfl_spec_decode_rounds_total") == mi["spec_verify_ct"], "spec counters follow meta_info")
        drafts = delta("vllm:spec_decode_num_drafts_total" + key)
        t.check(0 < drafts <= mi["spec_verify_ct"], f"num_drafts +{drafts}")
        per_pos = [k for k in after if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")]
        t.check(len(per_pos) == 7 and 'position="0"' in per_pos[0], f"per-position counters: {per_pos}")
        # errors
        cases = [
            ("/v1/completions", '{"prompt": "x",', None, 400, "body"),
            ("/v1/completions", '"just a string"', None, 400, "body"),
            ("/v1/completions", '{"prompt": "x", "max_tokens": "many"}', None, 400, "max_tokens"),
            ("/v1/completions", '{"prompt": "x", "seed": -3}', None, 400, "seed"),
            ("/v1/completions", '{"prompt": "x", "stream": "yes"}', None, 400, "stream"),
            ("/v1/completions", '{"prompt": "x", "max_tokens": 300}', None, 400, "max_tokens"),
            ("/v1/completions", json.dumps({"prompt": list(range(300))}), None, 400, "prompt"),
            ("/v1/completions", '{"prompt": ["a", ""]}', None, 400, "prompt[1]"),
            ("/v1/completions", '{"prompt": ["a", "b"], "stream": true}', None, 400, "stream"),
            ("/v1/completions", '{"prompt": "x", "n": 2}', None, 400, "n"),
            ("/v1/completions", '{"prompt": "x", "top_p": 0}', None, 400, "top_p"),
            ("/v1/completions", '{"prompt": "x", "top_k": -5}', None, 400, "top_k"),
            ("/v1/completions", '{"prompt": "x", "logit_bias": {"3": 5}}', None, 400, "logit_bias"),
            ("/v1/completions", '{"prompt": "x", "frobnicate": true}', None, 400, "frobnicate"),
            ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], '
             '"response_format": {"type": "json_object"}}', None, 400, "response_format"),
            ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], '
             '"tools": [{"type": "function", "function": {"name": "f"}}]}', None, 400, "tools"),
            ("/v1/chat/completions", '{"messages": "hi"}', None, 400, "messages"),
            ("/generate", '{"text": "x", "sampling_params": {"temperature": "hot"}}', None, 400,
             "sampling_params.temperature"),
            ("/generate", '{"text": "x", "input_ids": [1]}', None, 400, None),
            ("/detokenize", '{"tokens": [1, -2]}', None, 400, "tokens"),
            ("/nowhere", "{}", None, 404, None),
            ("/v1/completions", None, "GET", 405, None),
            ("/metrics", "{}", None, 405, None),
            ("/v1/completions", json.dumps({"prompt": "x" * 70000}), None, 413, None),
        ]
        for path, raw, method, want, param in cases:
            st, out = srv.request(path, raw=raw, method=method)
            try:
                err = json.loads(out)["error"]
            except (ValueError, KeyError):
                err = {}
            t.check(st == want and isinstance(err.get("message"), str) and err.get("code") == want and
                    (param is None or err.get("param") == param),
                    f"{method or 'POST'} {path} {str(raw)[:50]}: want {want} ({param}), got {st} {out[:200]}")
        st, out = srv.request("/v1/completions", method="GET", headers=True)
        t.check(st == 405 and re.search(r"^Allow: POST", out, re.M | re.I), "405 carries Allow: POST")
        after2 = metrics(srv)
        t.check(after2.get('dfl_http_requests_total{endpoint="other",status="404"}') == 1 and
                after2.get('dfl_http_requests_total{endpoint="/v1/completions",status="413"}') == 1,
                "error statuses counted")
        st, r = srv.json("/v1/models")
        t.check(st == 200 and r["data"][0]["id"] == "qwen3_tiny" and r["data"][0]["max_model_len"] == 256 and
                r["data"][0]["activations"] == "f32" and r["data"][0]["device"] == "cpu", f"/v1/models {r}")
    finally:
        t.check(srv.stop() == 0, "server exit status")


def prometheus():
    """/metrics parsed by prometheus_client's own parser: every family has its declared type
    (no 'unknown' family split off a counter), every counter sample ends in _total, and the
    time-to-first-token / inter-token / end-to-end histograms count the requests made."""
    from prometheus_client.parser import text_string_to_metric_families

    srv = Server(TINY, D3, "--model-name", 'tiny "q"\\3')
    try:
        n_req = 0
        for body in ({"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True},
                     {"prompt": PROMPTS[1], "max_tokens": 9, "temperature": 0, "ignore_eos": True, "stream": True}):
            st, _ = srv.request("/v1/completions", body)
            n_req += st == 200
        st, _ = srv.json("/generate", {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 7,
                                                                             "temperature": 0, "ignore_eos": True}})
        n_req += st == 200
        t.check(n_req == 3, f"3 requests answered 200: {n_req}")
        st, text = srv.request("/metrics")
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        want = {"dfl_http_requests": "counter", "dfl_requests_cancelled": "counter", "dfl_queue_capacity": "gauge",
                "dfl_connections_cut": "counter", "dfl_streams_stalled": "counter",
                "dfl_spec_decode_rounds": "counter", "vllm:num_requests_running": "gauge",
                "vllm:num_requests_waiting": "gauge", "vllm:request_success": "counter",
                "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
                "vllm:spec_decode_num_drafts": "counter", "vllm:spec_decode_num_draft_tokens": "counter",
                "vllm:spec_decode_num_accepted_tokens": "counter",
                "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
                "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
                "vllm:e2e_request_latency_seconds": "histogram"}
        got = {n: f.type for n, f in fams.items()}
        t.check(got == want, f"families and types: {got}")
        for n, f in fams.items():
            t.check(len(f.samples) > 0, f"{n}: has samples")
            if f.type == "counter":
                t.check(all(x.name == n + "_total" for x in f.samples), f"{n}: samples named {n}_total")
            if n.startswith("vllm:"):
                t.check(all(x.labels.get("model_name") == 'tiny "q"\\3' for x in f.samples),
                        f"{n}: model_name label escaped and parsed back")
        val = {n: sum(x.value for x in f.samples) for n, f in fams.items() if f.type in ("counter", "gauge")}
        t.check(val["vllm:request_success"] == 3 and val["vllm:generation_tokens"] == 12 + 9 + 7,
                f"counters: {val}")

        def hist(name):
            f = fams[name]
            b = [(x.labels["le"], x.value) for x in f.samples if x.name == name + "_bucket"]
            cnt = [x.value for x in f.samples if x.name == name + "_count"][0]
            tot = [x.value for x in f.samples if x.name == name + "_sum"][0]
            vals = [v for _, v in b]
            t.check(b[-1][0] == "+Inf" and b[-1][1] == cnt and vals == sorted(vals) and len(b) > 10,
                    f"{name}: cumulative buckets ending at +Inf = count: {b}")
            return cnt, tot

        c, s_ = hist("vllm:time_to_first_token_seconds")
        t.check(c == 3 and s_ > 0, f"ttft counts the 3 requests: {c}, sum {s_}")
        c, s_ = hist("vllm:e2e_request_latency_seconds")
        t.check(c == 3 and s_ > 0, f"e2e counts the 3 requests: {c}, sum {s_}")
        c, s_ = hist("vllm:inter_token_latency_seconds")
        rounds = val["dfl_spec_decode_rounds"]
        # an interval per engine output after the first: at most one per round of each request
        t.check(3 <= c <= rounds and s_ > 0, f"inter-token latency: {c} intervals, {rounds} rounds")
    finally:
        t.check(srv.stop() == 0, "server exit status")


def stream_until(srv, body, nbytes):
    """Start a streamed request with curl; return the process once nbytes arrived."""
    p = subprocess.Popen(["curl", "-sS", "-N", "-H", "Content-Type: application/json", "--data-binary",
                          json.dumps(body), srv.url + "/v1/completions"], stdout=subprocess.PIPE)
    got = b""
    while len(got) < nbytes:
        chunk = p.stdout.read1(4096)
        if not chunk:
            break
        got += chunk
    return p, got


def queue_disconnect_sigterm():
    srv = Server(TINY, D3, "--max-queue", 0, "--max-context", 4096)
    long_req = {"prompt": PROMPTS[0], "max_tokens": 4000, "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        p, got = stream_until(srv, long_req, 2000)
        t.check(len(got) >= 2000, "long stream started")
        # the engine is busy and nothing may wait: 503
        st, r = srv.json("/v1/completions", {"prompt": "x", "max_tokens": 2})
        t.check(st == 503 and r.get("error", {}).get("code") == 503, f"queue full: {st} {r}")
        t.check(srv.request("/health")[0] == 200, "health while busy")
        before = metrics(srv).get("dfl_requests_cancelled_total", 0)
        p.kill()  # the client goes away mid-stream
        p.wait()
        t0 = time.time()
        st = 0
        while time.time() - t0 < 20:
            st, r = srv.json("/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0})
            if st == 200:
                break
            time.sleep(0.05)
        t.check(st == 200, f"after the disconnect the engine is free again ({st})")
        t.check(metrics(srv).get("dfl_requests_cancelled_total", 0) == before + 1, "cancelled counter +1")
        t.check(srv.request("/health")[0] == 200, "healthy after the disconnect")
        # SIGTERM with a stream in flight: it completes, then the server exits 0
        body = dict(long_req, max_tokens=300)
        p, got = stream_until(srv, body, 300)
        srv.p.send_signal(signal.SIGTERM)
        rest = p.stdout.read()
        p.wait()
        events, done = sse((got + rest).decode())
        t.check(done and sum(len(e["choices"][0]["token_ids"]) for e in events) == 300,
                "stream in flight at SIGTERM completes")
        t.check(srv.p.wait(timeout=60) == 0, "SIGTERM: exit status 0")
    finally:
        srv.stop()


def tree_budget():
    """--tree-budget: DDTree verification; greedy outputs equal dfl generate's (and greedy decoding)."""
    srv = Server(VLM, D35, "--tree-budget", 8)
    try:
        for prompt in PROMPTS:
            ref = dfl_json("generate", "--target", VLM, "--drafter", D35, "--tree-budget", 8, "--prompt", prompt,
                           "--max-new", 24, "--json", "--ignore-eos")
            greedy = dfl_json("generate", "--target", VLM, "--prompt", prompt, "--max-new", 24, "--json",
                              "--ignore-eos")
            st, r = srv.json("/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                                             "ignore_eos": True}})
            t.check(st == 200 and r.get("output_ids") == ref["tokens"] == greedy["tokens"],
                    f"DDTree-8 server: {r.get('output_ids')} vs generate {ref['tokens']}")
            t.check(r.get("meta_info", {}).get("spec_verify_ct") == ref["stats"]["rounds"], "DDTree rounds")
        st, r = srv.json("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0.7})
        t.check(st == 400 and "DDTree" in r.get("error", {}).get("message", ""), f"sampling with DDTree: {st} {r}")
        # logprobs from the tree's rows (the accepted path's nodes) against transformers
        import tempfile
        from safetensors.numpy import load_file
        st, r = srv.json("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0,
                                             "ignore_eos": True, "logprobs": 2})
        _, tk = srv.json("/tokenize", {"text": PROMPTS[0]})
        gen, pids = r["choices"][0]["token_ids"], tk["tokens"]
        ref_path = os.path.join(tempfile.mkdtemp(prefix="dfl-lp-"), "ref.safetensors")
        reference("--model", VLM, "--ids", ",".join(map(str, pids + gen)), "--out", ref_path)
        ref = log_softmax_rows(load_file(ref_path)["logits"])
        tl = r["choices"][0]["logprobs"]["token_logprobs"]
        worst = max(abs(ref[len(pids) - 1 + i, g] - tl[i]) for i, g in enumerate(gen))
        t.check(st == 200 and len(tl) == 24 and worst < 1e-4, f"DDTree logprobs vs transformers: worst {worst:.3g}")
    finally:
        t.check(srv.stop() == 0, "DDTree server exits cleanly")


def log_softmax_rows(logits):
    """float64 log_softmax over the last axis of a numpy array."""
    import numpy as np
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def logprobs_echo():
    """logprobs and echo on /v1/completions: greedy tokens' logprobs against transformers'
    log_softmax over the same sequence (tools/reference/hf_forward.py), the top-1 alternative is
    the greedy token, the tokens are the same with and without logprobs (greedy and sampled),
    echo + max_tokens 0/1 scores the prompt as lm-eval's loglikelihood requests do, bad values
    give 400 naming the field."""
    import tempfile
    from safetensors.numpy import load_file
    tol = 1e-4
    srv = Server(TINY, D3)
    try:
        n_new = 12
        base = {"prompt": PROMPTS[0], "max_tokens": n_new, "temperature": 0, "ignore_eos": True}
        st, plain = srv.json("/v1/completions", base)
        st2, lp = srv.json("/v1/completions", {**base, "logprobs": 5})
        t.check(st == st2 == 200, f"logprobs request: {st} {st2} {lp}")
        gen = plain["choices"][0]["token_ids"]
        ref_gen = generate(TINY, D3, PROMPTS[0], n_new, ignore_eos=True)["tokens"]
        t.check(gen == lp["choices"][0]["token_ids"] == ref_gen,
                f"greedy tokens with/without logprobs/generate: {gen} {lp['choices'][0]['token_ids']} {ref_gen}")
        t.check(plain["choices"][0]["logprobs"] is None, "no logprobs unless asked")
        L = lp["choices"][0]["logprobs"]
        t.check(len(L["tokens"]) == len(L["token_logprobs"]) == len(L["top_logprobs"]) == len(L["text_offset"])
                == n_new, f"logprobs lengths: {L}")
        t.check("".join(L["tokens"]) == lp["choices"][0]["text"], "tokens concatenate to the text")
        t.check(L["text_offset"][0] == 0 and all(L["text_offset"][i + 1] == L["text_offset"][i] + len(L["tokens"][i])
                                                 for i in range(n_new - 1)), f"text_offset {L['text_offset']}")
        for i in range(n_new):
            top = L["top_logprobs"][i]
            best = max(top, key=top.get)
            t.check(len(top) <= 5 + 1 and best == L["tokens"][i] and abs(top[best] - L["token_logprobs"][i]) < 1e-6,
                    f"top-1 at {i} is the greedy token: {top} vs {L['tokens'][i]}")
        # the reference: transformers over prompt + output, log_softmax at temperature 1
        _, tk = srv.json("/tokenize", {"text": PROMPTS[0]})
        pids = tk["tokens"]
        seq = pids + gen
        tmp = tempfile.mkdtemp(prefix="dfl-lp-")
        ref_path = os.path.join(tmp, "ref.safetensors")
        reference("--model", TINY, "--ids", ",".join(map(str, seq)), "--out", ref_path)
        ref = log_softmax_rows(load_file(ref_path)["logits"])
        want = [ref[len(pids) - 1 + i, gen[i]] for i in range(n_new)]
        worst = max(abs(a - b) for a, b in zip(want, L["token_logprobs"]))
        t.check(worst < tol, f"greedy token logprobs vs transformers: worst |diff| {worst:.3g}")
        for i in range(n_new):  # the alternatives' values too
            row = ref[len(pids) - 1 + i]
            order = sorted(range(len(row)), key=lambda v: -row[v])[:5]
            t.check(abs(row[order[0]] - max(L["top_logprobs"][i].values())) < tol
                    and abs(row[order[1]] - sorted(L["top_logprobs"][i].values())[-2]) < tol,
                    f"top_logprobs at {i} vs transformers")
        print(f"logprobs vs transformers: worst |diff| {worst:.3g}", flush=True)
        # sampled: the same tokens with and without logprobs
        samp = {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0.8, "seed": 7, "ignore_eos": True}
        _, a = srv.json("/v1/completions", samp)
        _, b = srv.json("/v1/completions", {**samp, "logprobs": 3})
        t.check(a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"] and len(a["choices"][0]["token_ids"]) == 24,
                "sampled tokens with and without logprobs")
        t.check(all(x <= 0 for x in b["choices"][0]["logprobs"]["token_logprobs"]), "logprobs <= 0")
        # lm-eval's loglikelihood shape: prompt = context + continuation ids, echo, logprobs 1, max_tokens 0 or 1
        ctx = len(pids)
        cont_ref = sum(want[:6])
        for mt in (0, 1):
            st, r = srv.json("/v1/completions", {"prompt": [seq[:ctx + 6]], "echo": True, "logprobs": 1,
                                                 "max_tokens": mt, "temperature": 0, "seed": 1234})
            c = r.get("choices", [{}])[0]
            L = c.get("logprobs") or {}
            tl = L.get("token_logprobs", [])
            t.check(st == 200 and len(tl) == ctx + 6 + mt and tl[0] is None and L["top_logprobs"][0] is None,
                    f"echo max_tokens {mt}: {st} {r}")
            if len(tl) != ctx + 6 + mt:
                continue
            got = sum(tl[ctx:ctx + 6])
            t.check(abs(got - cont_ref) < tol, f"echo max_tokens {mt}: continuation logprob {got} vs {cont_ref}")
            prompt_ref = [ref[p - 1, seq[p]] for p in range(1, ctx + 6)]
            w = max(abs(a - b) for a, b in zip(prompt_ref, tl[1:ctx + 6]))
            t.check(w < tol, f"echo max_tokens {mt}: prompt logprobs vs transformers, worst {w:.3g}")
            greedy = all(tl[p] == max(L["top_logprobs"][p].values()) for p in range(ctx, ctx + 6))
            t.check(greedy, "the greedy continuation is greedy by lm-eval's test")
            t.check(c["text"].startswith(PROMPTS[0]) and len(c["token_ids"]) == mt, f"echo text {c['text']!r}")
            if mt:
                t.check(c["token_ids"] == [gen[6]], f"max_tokens 1 after the echo: {c['token_ids']} vs {gen[6]}")
        st, r = srv.json("/v1/completions", {"prompt": PROMPTS[0], "echo": True, "max_tokens": 3, "temperature": 0,
                                             "ignore_eos": True})
        t.check(st == 200 and r["choices"][0]["text"].startswith(PROMPTS[0]) and r["choices"][0]["token_ids"] == gen[:3]
                and plain["choices"][0]["text"].startswith(r["choices"][0]["text"][len(PROMPTS[0]):])
                and r["choices"][0]["logprobs"] is None, f"echo without logprobs: {r}")
        # bad values name the field
        for body, param in [({"logprobs": 21}, "logprobs"), ({"logprobs": -1}, "logprobs"), ({"logprobs": "x"}, "logprobs"),
                            ({"logprobs": 1.5}, "logprobs"), ({"echo": "yes"}, "echo"), ({"max_tokens": 0}, "max_tokens"),
                            ({"logprobs": 1, "stream": True}, "logprobs"), ({"echo": True, "stream": True}, "echo")]:
            st, r = srv.json("/v1/completions", {"prompt": "a", **body})
            t.check(st == 400 and r.get("error", {}).get("param") == param, f"{body}: {st} {r}")
        for body, param in [({"logprobs": True, "stream": True}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
                            ({"logprobs": 1}, "logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                            ({"echo": True}, "echo")]:
            st, r = srv.json("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], **body})
            t.check(st == 400 and r.get("error", {}).get("param") == param, f"chat {body}: {st} {r}")
        # chat: the same numbers as a completion of the ChatML text
        msgs = [{"role": "user", "content": PROMPTS[1]}]
        st, c = srv.json("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                                  "logprobs": True, "top_logprobs": 3})
        chatml = f"<|im_start|>user\n{PROMPTS[1]}<|im_end|>\n<|im_start|>assistant\n"
        _, p = srv.json("/v1/completions", {"prompt": chatml, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                            "logprobs": 3})
        content = (c.get("choices", [{}])[0].get("logprobs") or {}).get("content", [])
        pl = p["choices"][0]["logprobs"]
        t.check(st == 200 and len(content) == 8 and c["choices"][0]["token_ids"] == p["choices"][0]["token_ids"]
                and [x["token"] for x in content] == pl["tokens"]
                and all(abs(x["logprob"] - y) < 1e-6 for x, y in zip(content, pl["token_logprobs"]))
                and all(len(x["top_logprobs"]) == 3 and x["top_logprobs"][0]["token"] == x["token"]
                        and x["top_logprobs"][0]["logprob"] == x["logprob"] and bytes(x["bytes"]).decode() == x["token"]
                        for x in content), f"chat logprobs: {st} {c}")
        _, c0 = srv.json("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "logprobs": False})
        t.check(c0["choices"][0]["logprobs"] is None, "chat without logprobs: null")
    finally:
        t.check(srv.stop() == 0, "logprobs server exits cleanly")


if __name__ == "__main__":  # Server and metrics are shared with test_serve_limits.py
    t.run(logprobs_echo)
    t.run(tree_budget)
    t.run(outputs_match, TINY, D3)
    t.run(outputs_match, TINY, None)
    t.run(outputs_match, VLM, D35)
    t.run(stops_tokenize_metrics)
    t.run(prometheus)
    t.run(queue_disconnect_sigterm)
    t.done()
