"""`dfl eval` and `dfl eval-merge`: results, summaries and plots; every speculative output
checked against the autoregressive one; --resume after an interruption; --shard + eval-merge
equal to one run; MT-Bench's second turn; reference agreement from a file and from a running
`dfl serve` (OpenAI and SGLang endpoints), including a deliberately different target whose
divergence must be caught; an MoE target (online and replay); bad input."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import xml.etree.ElementTree as ET

from dfltest import DATA, DFL, SOURCE, Tally, dfl, dfl_json, fixture, st_read_raw

t = Tally("eval")
tmp = tempfile.mkdtemp(prefix="dfl-eval-")
GSM = os.path.join(DATA, "datasets", "gsm8k", "test.jsonl")
MTB = os.path.join(DATA, "datasets", "mt_bench", "question.jsonl")
T, D1, D2 = fixture("qwen3_tiny"), fixture("dflash_qwen3"), fixture("dflash_qwen3_toplevel")


def lines(d, name="results.jsonl"):
    with open(os.path.join(d, name)) as f:
        return [json.loads(x) for x in f if x.strip()]


def summary(d):
    return json.load(open(os.path.join(d, "summary.json")))


def comparable(s):
    """The summary without timings."""
    keep = ("drafter", "mode", "responses", "tokens", "rounds", "drafted", "accepted", "tau", "tau_token_weighted",
            "per_position", "accept_hist", "mismatches")
    return sorted((tuple(json.dumps(r[k]) for k in keep) for r in s["results"]))


def basic():
    out = os.path.join(tmp, "basic")
    p = dfl("eval", "--online", "--target", T, "--drafter", D1, "--drafter", D2, "--prompts", GSM, "--limit", 4, "--max-new", 16,
            "--tree-budget", "0,4", "--out", out, "--progress", "lines")
    rs = lines(out)
    t.check(len(rs) == 4 * (1 + 2 * 2), f"results lines: {len(rs)}")
    t.check(all(r["match"] for r in rs if r["mode"] != "ar"), "every speculative output matches")
    t.check({r["mode"] for r in rs} == {"ar", "chain", "ddtree-4"}, f"modes {set(r['mode'] for r in rs)}")
    s = summary(out)
    t.check(s["prompts"] == 4 and len(s["results"]) == 4, f"summary: {s['prompts']} prompts {len(s['results'])} rows")
    for r in s["results"]:
        t.check(r["responses"] == 4 and r["mismatches"] == 0 and r["tau"] >= 1 and len(r["per_position"]) ==
                r["accept_hist"].__len__() - 1 and r["speedup"] > 0, f"summary row {r}")
    t.check("definitions" in s and "tau" in s["definitions"] and s["run"]["threads"] >= 1 and
            s["run"]["peak_rss_bytes"] > 0, "definitions, threads and memory stated")
    md = open(os.path.join(out, "summary.md")).read()
    t.check("| drafter | chain | ddtree-4 |" in md and D1 in md and D2 in md, "summary.md has drafters x modes")
    for svg in ("per_position.svg", "tau_hist.svg"):
        root = ET.parse(os.path.join(out, svg)).getroot()
        t.check(root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) == 4,
                f"{svg}: one line per drafter x mode")
    t.check("[dfl eval] 4/4" in p.stderr, "plain progress lines off a terminal")
    return out


def moe():
    """An eval on the hybrid MoE fixture with its random drafter: online chain and DDTree outputs equal
    the autoregressive ones, and a replay eval recorded with --check-ar gives the same statistics."""
    tgt, drf = fixture("qwen35_moe_vlm"), fixture("dflash_qwen35_moe")
    on, rp = os.path.join(tmp, "moe-online"), os.path.join(tmp, "moe-replay")
    args = ["--target", tgt, "--drafter", drf, "--prompts", GSM, "--limit", 3, "--max-new", 20, "--tree-budget", "0,8",
            "--progress", "none"]
    dfl("eval", "--online", *args, "--out", on)
    dfl("eval", *args, "--check-ar", "--out", rp)
    rs = lines(on)
    t.check(len(rs) == 3 * 3 and all(r["match"] for r in rs if r["mode"] != "ar"), "MoE: every speculative output matches")
    so, sr = summary(on), summary(rp)
    t.check(all(r["mismatches"] == 0 and r["responses"] == 3 and r["tau"] >= 1 for r in so["results"]),
            f"MoE summary rows {so['results']}")
    key = ("mode", "tokens", "rounds", "drafted", "accepted", "tau", "per_position", "accept_hist")
    pick = lambda s, m: sorted(tuple(json.dumps(r[k]) for k in key) for r in s["results"] if r["method"] == m)
    t.check(len(pick(so, "online")) == 2 and pick(so, "online") == pick(sr, "replay"),
            "MoE: replay statistics equal the online run's")


def plots():
    """The SVG plots have labelled axes with ticks and values on both (per_position.svg: in each of
    its chain and DDTree panels), use the width the legend leaves; positions a mode never proposed
    (DDTree-2 drafts 2 deep at most) are left out of the per-position table and plot (summary.json:
    null) instead of showing 0."""
    out = os.path.join(tmp, "plots")
    dfl("eval", "--target", T, "--drafter", D1, "--prompts", GSM, "--limit", 2, "--max-new", 16,
        "--tree-budget", "0,2,4", "--out", out, "--progress", "none")
    ns = "{http://www.w3.org/2000/svg}"
    for name in ("per_position.svg", "tau_hist.svg", "tau_budget.svg"):
        root = ET.parse(os.path.join(out, name)).getroot()
        texts = {c: [e.text for e in root.iter(ns + "text") if e.get("class") == c]
                 for c in ("xlabel", "ylabel", "xtick", "ytick")}
        panels = 2 if name == "per_position.svg" else 1  # chain and DDTree rates apart
        t.check(len(texts["xlabel"]) == panels and len(texts["ylabel"]) == panels and all(texts["xlabel"] + texts["ylabel"]),
                f"{name}: axis labels {texts}")
        for c in ("xtick", "ytick"):
            t.check(len(texts[c]) >= 2 and all(re.fullmatch(r"[0-9.]+", v or "") for v in texts[c]),
                    f"{name}: {c} values {texts[c]}")
        ylab = [e for e in root.iter(ns + "text") if e.get("class") == "ylabel"][0]
        t.check("rotate(-90" in (ylab.get("transform") or ""), f"{name}: y label along the axis")
        frame = [e for e in root.iter(ns + "rect") if e.get("class") == "frame"][0]
        t.check(float(frame.get("width")) >= 0.6 * float(root.get("width")), f"{name}: plot width {frame.get('width')}")
    s = summary(out)
    rows = {(r["mode"], r["method"]): r for r in s["results"]}
    d2 = rows[("ddtree-2", "replay")]["per_position"]
    t.check(all(v is not None for v in d2[:2]) and all(v is None for v in d2[2:]),
            f"summary.json: ddtree-2 positions past 2 are null: {d2}")
    t.check(all(v is not None for v in rows[("chain", "replay")]["per_position"]), "chain proposes every position")
    md = open(os.path.join(out, "summary.md")).read()
    row = [ln for ln in md.splitlines() if ln.startswith("| ") and "| ddtree-2 |" in ln][-1]
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    t.check(len(cells) == 7 and cells[2:] == ["–"] * 5 and all(re.fullmatch(r"[0-9.]+", c) for c in cells[:2]),
            f"summary.md per-position row: {row}")
    root = ET.parse(os.path.join(out, "per_position.svg")).getroot()
    legends = [e.text for e in root.iter(ns + "text") if e.get("class") == "legend"]
    lines_ = root.findall(f".//{ns}polyline")
    t.check(len(lines_) == len(legends), "a line per legend entry")
    for leg, pl in zip(legends, lines_):
        npts = len(pl.get("points").split())
        want = 2 if leg.endswith("ddtree-2") else 4 if leg.endswith("ddtree-4") else 7
        t.check(npts == want, f"per_position.svg: {leg}: {npts} points, want {want} (no never-proposed positions)")


def how_to_read():
    """summary.md's "How to read this" section, from the run's own numbers: which τ definition is
    larger (as the tables say), a DDTree budget below the block that trails the chain (the embedded
    pair: ddtree-4 accepts at most 4 drafts a round, chain proposes 15), the best mode; per-response
    speedup spreads (measured: the --check-ar recording row; modeled: the replays) ordered
    p10 <= p50 <= p90 in summary.json and next to the aggregates in summary.md; one response: no spread."""
    tgt, drf = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
    prompts = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
    out = os.path.join(tmp, "howto")
    dfl("eval", "--target", tgt, "--drafter", drf, "--prompts", prompts, "--limit", 6, "--max-new", 64,
        "--tree-budget", "0,4", "--check-ar", "--out", out, "--progress", "none")
    md = open(os.path.join(out, "summary.md")).read()
    t.check("## How to read this" in md, "summary.md has the How to read this section")
    sec = md.split("## How to read this", 1)[-1].split("\n## ", 1)[0]
    rows = summary(out)["results"]
    # 1. the larger tau definition, consistent with the tables (3 decimals as printed)
    tau = {(r["label"], r["mode"]): (round(r["tau"], 3), round(r["tau_token_weighted"], 3)) for r in rows}
    n_mean = sum(a > b for a, b in tau.values())
    n_tw = sum(b > a for a, b in tau.values())
    if n_mean == len(tau):
        want = "τ is larger than token-weighted τ in every row"
    elif n_tw == len(tau):
        want = "token-weighted τ is larger than τ in every row"
    elif not n_mean and not n_tw:
        want = "agree in every row"
    else:
        want = f"τ is larger in {n_mean} of {len(tau)} rows, token-weighted τ in {n_tw}"
    t.check(want in sec, f"How to read names the larger τ ({want!r}): {sec}")
    m = re.search(r"largest gap: (.+) (\S+), τ ([0-9.]+) vs token-weighted ([0-9.]+) \(([+-][0-9.]+),", sec)
    t.check(m is not None, f"the largest τ gap quoted: {sec}")
    if m:
        label, mode, a, b = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
        t.check(tau.get((label, mode)) == (a, b), f"quoted gap {label} {mode} {a} {b} is the table's {tau.get((label, mode))}")
        gaps = [abs(x - y) for x, y in tau.values()]
        t.check(abs(abs(a - b) - max(gaps)) < 0.0015, f"the quoted gap {a - b:.3f} is the largest {max(gaps):.3f}")
        t.check(f"| {label} |" in md and f" {a:.3f} |" in md and f" {b:.3f} |" in md, "quoted τ values are in the tables")
    t.check("tau_accept" in sec and "vLLM" in sec, "vLLM's τ is named")
    # 2. DDTree-4 below the block (15 drafts) trails chain on this pair: flagged with its numbers
    rr = {(r["label"], r["mode"]): r for r in rows if r["method"] == "replay"}
    d4, ch = rr[(drf, "ddtree-4")], rr[(drf, "chain")]
    t.check(d4["tau"] < ch["tau"], f"the embedded pair's ddtree-4 trails chain: {d4['tau']} vs {ch['tau']}")
    t.check("budget below the block trails the chain" in sec and
            f"{drf} ddtree-4 τ {d4['tau']:.3f} (at most 5) vs chain {ch['tau']:.3f}" in sec,
            f"ddtree-4 trailing chain flagged with the numbers: {sec}")
    best = max((r for r in rows if r["label"] == drf), key=lambda r: r["tau"])
    t.check(f"{drf}: by τ {best['mode']} ({best['tau']:.3f})" in sec, f"best mode by τ named: {sec}")
    # 3. spreads: present, ordered, next to the aggregate
    for r in rows:
        for key, agg in (("speedup_spread", "speedup"), ("speedup_modeled_spread", "speedup_modeled")):
            sp = r.get(key, "absent")
            t.check(sp != "absent", f"{r['label']} {r['mode']}: {key} present")
            if r[agg] is None:
                continue
            t.check(isinstance(sp, dict) and sp["responses"] == 6 and sp["p10"] <= sp["p50"] <= sp["p90"] and sp["p10"] > 0,
                    f"{r['label']} {r['mode']}: {key} {sp}")
            if isinstance(sp, dict):  # the table cell, to the printed 2 decimals (JSON has 4: allow a rounding step)
                cells = [tuple(map(float, c)) for c in re.findall(r"([0-9.]+)x \(([0-9.]+)–([0-9.]+)\)", md)]
                t.check(any(all(abs(x - y) < 0.006 for x, y in zip(c, (r[agg], sp["p10"], sp["p90"]))) for c in cells),
                        f"summary.md: {agg} {r[agg]} with its p10–p90 {sp}: {cells}")
    rec = [r for r in rows if r["method"] == "online"]
    t.check(len(rec) == 1 and rec[0]["speedup"] and rec[0]["speedup_spread"], "the --check-ar recording row: measured spread")
    t.check("Measured speedups" in sec and "Modeled speedups" in sec and "not move them" in sec, f"speedup kinds: {sec}")
    # one response, chain only: no spread, nothing about tree budgets
    one = os.path.join(tmp, "howto1")
    dfl("eval", "--target", tgt, "--drafter", drf, "--prompts", prompts, "--limit", 1, "--max-new", 32, "--check-ar",
        "--out", one, "--progress", "none")
    s1 = summary(one)["results"]
    t.check(all(r["speedup_spread"] is None and r["speedup_modeled_spread"] is None for r in s1),
            f"one response: no spread {[(r['speedup_spread'], r['speedup_modeled_spread']) for r in s1]}")
    md1 = open(os.path.join(one, "summary.md")).read()
    t.check("no spread" in md1 and "trails the chain" not in md1,
            "one response: summary.md says no spread, flags no tree budget")


def resume(base):
    out = os.path.join(tmp, "resume")
    os.makedirs(out)
    with open(os.path.join(base, "results.jsonl")) as f:
        text = f.read()
    with open(os.path.join(out, "results.jsonl"), "w") as f:  # an interrupted run: 2.5 prompts written
        f.write(text[: text.index('{"prompt_id": "3"') + 40])
    p = dfl("eval", "--online", "--target", T, "--drafter", D1, "--drafter", D2, "--prompts", GSM, "--limit", 4, "--max-new", 16,
            "--tree-budget", "0,4", "--out", out, check=False)
    t.check(p.returncode != 0 and "--resume" in p.stderr, "existing results need --resume")
    dfl("eval", "--online", "--target", T, "--drafter", D1, "--drafter", D2, "--prompts", GSM, "--limit", 4, "--max-new", 16,
        "--tree-budget", "0,4", "--out", out, "--resume")
    rs = lines(out)
    keys = [(r["prompt_id"], r["turn"], r["drafter"], r["mode"]) for r in rs]
    t.check(len(set(keys)) == 20, f"resumed run has every response once: {len(set(keys))}")
    t.check(comparable(summary(out)) == comparable(summary(base)), "resumed summary equals the uninterrupted one")


def repeat():
    """--repeat 3 (online): every run of each prompt three times (rows rep 0..2, the same tokens);
    the statistics are the first run's (equal to an unrepeated run's), each row gets its speedup per
    repetition with min <= median <= max (summary.json speedup_runs, summary.md's table and How to
    read this); an interrupted repeated run resumes to every repetition once; --repeat is refused
    without --online and out of range."""
    args = ["--online", "--target", T, "--drafter", D1, "--prompts", GSM, "--limit", 3, "--max-new", 16,
            "--tree-budget", "0,4", "--progress", "none"]
    out, one = os.path.join(tmp, "repeat"), os.path.join(tmp, "repeat1")
    dfl("eval", *args, "--repeat", 3, "--out", out)
    dfl("eval", *args, "--out", one)
    rs = lines(out)
    keys = {(r["prompt_id"], r["drafter"], r["mode"], r.get("rep", 0)) for r in rs}
    t.check(len(rs) == 27 and len(keys) == 27, f"3 prompts x 3 runs x 3 repetitions: {len(rs)} lines, {len(keys)} distinct")
    first = {(r["prompt_id"], r["drafter"], r["mode"]): r["output_ids"] for r in rs if r.get("rep", 0) == 0}
    t.check(all(r["output_ids"] == first[(r["prompt_id"], r["drafter"], r["mode"])] and r["match"] is not False
                for r in rs), "every repetition gives the first run's tokens")
    s, s1 = summary(out), summary(one)
    t.check(comparable(s) == comparable(s1) and s["prompts"] == 3, "statistics are the first run's: as an unrepeated run")
    md = open(os.path.join(out, "summary.md")).read()
    for r in s["results"]:
        ru = r["speedup_runs"]
        t.check(isinstance(ru, dict) and ru["runs"] == 3 and len(ru["values"]) == 3 and
                0 < ru["min"] <= ru["median"] <= ru["max"] and abs(ru["values"][0] - r["speedup"]) < 1e-3 and
                ru["median"] == sorted(ru["values"])[1], f"{r['mode']}: speedup_runs {ru} (first run {r['speedup']})")
        if isinstance(ru, dict):
            # summary.md rounds the exact values to 2 decimals, summary.json keeps 4: compare the
            # cells within half a cent plus the JSON's rounding, not as strings (a value near a
            # rounding boundary, e.g. 0.19497 -> "0.19" in md but 0.1950 -> "0.20" here)
            cells = [tuple(map(float, m)) for m in re.findall(r"(\d+\.\d\d)x \((\d+\.\d\d)–(\d+\.\d\d)\)", md)]
            want = (ru["median"], ru["min"], ru["max"])
            t.check(any(all(abs(a - b) <= 0.00501 for a, b in zip(c, want)) for c in cells),
                    f"summary.md shows {r['mode']}'s runs as {want} (cells {cells})")
    t.check("## speedup over repeated runs" in md and "Over the 3 repeated runs here" in md and
            "the first of the repeated runs" in md, "summary.md: the runs' table and How to read this")
    t.check(all(r["speedup_runs"] is None for r in s1["results"]) and
            "`--repeat N` runs every prompt N times" in open(os.path.join(one, "summary.md")).read(),
            "one run: no range, the option is suggested")
    # interrupted in the second prompt's second repetition, then --resume
    res = os.path.join(tmp, "repeat-resume")
    os.makedirs(res)
    text = open(os.path.join(out, "results.jsonl")).read()
    cut = [i for i, x in enumerate(text.splitlines(keepends=True)) if '"prompt_id": "2"' in x and '"rep": 1' in x][1]
    with open(os.path.join(res, "results.jsonl"), "w") as f:
        f.write("".join(text.splitlines(keepends=True)[:cut]))
    dfl("eval", *args, "--repeat", 3, "--out", res, "--resume")
    rr = lines(res)
    t.check(len(rr) == 27 and {(r["prompt_id"], r["drafter"], r["mode"], r.get("rep", 0)) for r in rr} == keys,
            f"resumed repeated run: every repetition once ({len(rr)} lines)")
    t.check(comparable(summary(res)) == comparable(s1), "resumed repeated run: the same statistics")
    for bad, want in ((["--repeat", 2], "--online"), (["--repeat", 0], "--repeat"), (["--repeat", 101], "--repeat")):
        argv = [a for a in args if a != "--online"] if bad == ["--repeat", 2] else args
        p = dfl("eval", *argv, *bad, "--out", os.path.join(tmp, "repeat-bad"), check=False)
        t.check(p.returncode != 0 and want in p.stderr, f"{bad}: {p.stderr[-200:]}")


def shards(base):
    outs = []
    for i in range(2):
        o = os.path.join(tmp, f"shard{i}")
        dfl("eval", "--online", "--target", T, "--drafter", D1, "--drafter", D2, "--prompts", GSM, "--limit", 4, "--max-new", 16,
            "--tree-budget", "0,4", "--out", o, "--shard", f"{i}/2")
        outs.append(o)
    t.check(summary(outs[0])["prompts"] == 2, "a shard holds half the prompts")
    merged = os.path.join(tmp, "merged")
    dfl("eval-merge", "--out", merged, *outs)
    t.check(comparable(summary(merged)) == comparable(summary(base)), "merged shards equal one run")


def mtbench():
    out = os.path.join(tmp, "mtb")
    dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", MTB, "--format", "mtbench", "--limit", 2, "--max-new", 12,
        "--out", out)
    rs = lines(out)
    t.check(sorted({(r["prompt_id"], r["turn"]) for r in rs}) == [("81", 0), ("81", 1), ("82", 0), ("82", 1)],
            f"both turns: {sorted({(r['prompt_id'], r['turn']) for r in rs})}")
    out1 = os.path.join(tmp, "mtb1")
    dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", MTB, "--limit", 2, "--max-new", 12, "--out", out1,
        "--first-turn")
    t.check({r["turn"] for r in lines(out1)} == {0}, "--first-turn: one turn (format sniffed)")
    # formats: text and jsonl:FIELD
    txt = os.path.join(tmp, "p.txt")
    open(txt, "w").write("What is 2 + 3?\n\nName a prime.\n")
    o = os.path.join(tmp, "txt")
    dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", txt, "--format", "text", "--max-new", 8, "--out", o)
    t.check(summary(o)["prompts"] == 2, "text format: 2 prompts (blank line skipped)")
    js = os.path.join(tmp, "p.jsonl")
    open(js, "w").write('{"id": "a", "q": "hello"}\n{"id": "b", "q": "world"}\n')
    o = os.path.join(tmp, "jsonl")
    dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", js, "--format", "jsonl:q", "--max-new", 8, "--out", o)
    t.check(sorted({r["prompt_id"] for r in lines(o)}) == ["a", "b"], "jsonl:FIELD with ids")


def reference_file():
    # the truth of the VLM-layout checkpoint, as a reference for the text-only layout of the same weights
    a = os.path.join(tmp, "ref-a")
    dfl("eval", "--online", "--target", fixture("qwen35_vlm"), "--drafter", fixture("dflash_qwen35"), "--prompts", GSM, "--limit",
        3, "--max-new", 16, "--out", a)
    ref = os.path.join(tmp, "ref.jsonl")
    with open(ref, "w") as f:
        for r in lines(a):
            if r["mode"] == "ar":
                f.write(json.dumps({"id": r["prompt_id"], "output_ids": r["output_ids"]}) + "\n")
    same = os.path.join(tmp, "ref-same")
    dfl("eval", "--online", "--target", fixture("qwen35_text"), "--drafter", fixture("dflash_qwen35"), "--prompts", GSM, "--limit",
        3, "--max-new", 16, "--out", same, "--reference", ref)
    s = summary(same)["reference"]
    t.check(s["compared"] == 3 and s["identical"] == 3, f"same weights, other layout: {s}")
    other = os.path.join(tmp, "ref-other")
    dfl("eval", "--online", "--target", fixture("qwen35_r1"), "--drafter", fixture("dflash_qwen3"), "--prompts", GSM, "--limit", 3,
        "--max-new", 16, "--out", other, "--reference", ref, check=False)
    rr = lines(other, "reference.jsonl")
    t.check(summary(other)["reference"]["diverged"] == 3 and all(x["first_divergence"] >= 0 for x in rr),
            f"a different target is caught: {rr}")


def start_server(target):
    p = subprocess.Popen([DFL, "serve", "--target", target, "--port", "0"], stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"listening on (http://[^ ]+)", line)
    if not m:
        p.kill()
        raise AssertionError(f"serve did not start: {line}")
    return p, m.group(1)


def reference_url():
    srv, url = start_server(fixture("qwen35_vlm"))
    try:
        for path in ("/v1/completions", "/generate"):
            o = os.path.join(tmp, "url" + path.replace("/", "-"))
            dfl("eval", "--online", "--target", fixture("qwen35_text"), "--drafter", fixture("dflash_qwen35"), "--prompts", GSM,
                "--limit", 2, "--max-new", 12, "--out", o, "--reference-url", url + path)
            s = summary(o)["reference"]
            t.check(s["compared"] == 2 and s["identical"] == 2, f"reference server {path}: {s}")
        o = os.path.join(tmp, "url-other")
        dfl("eval", "--online", "--target", fixture("qwen35_r1"), "--drafter", fixture("dflash_qwen3"), "--prompts", GSM,
            "--limit", 2, "--max-new", 12, "--out", o, "--reference-url", url + "/v1/completions")
        t.check(summary(o)["reference"]["diverged"] == 2, "a server with another target is caught")
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=30)


def bad_input():
    bad = os.path.join(tmp, "bad.jsonl")
    open(bad, "w").write('{"question": "ok"}\n{"question": 3}\nnot json\n{"question": "fine"}\n')
    p = dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", bad, "--out", os.path.join(tmp, "b1"), check=False)
    t.check(p.returncode == 1 and f"{bad}:2" in p.stderr and "question" in p.stderr, f"malformed line: {p.stderr}")
    o = os.path.join(tmp, "b2")
    p = dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", bad, "--out", o, "--keep-going", "--max-new", 4)
    t.check(summary(o)["run"]["bad_prompt_lines"] == [2, 3] and summary(o)["prompts"] == 2, "keep-going lists lines")
    p = dfl("eval", "--online", "--target", T, "--drafter", fixture("dflash_qwen35"), "--prompts", GSM, "--out",
            os.path.join(tmp, "b3"), check=False)
    t.check(p.returncode == 1 and "does not fit" in p.stderr and not os.path.exists(os.path.join(tmp, "b3")),
            f"incompatible drafter refused before any work: {p.stderr}")
    p = dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", "/nonexistent.jsonl", "--out",
            os.path.join(tmp, "b4"), check=False)
    t.check(p.returncode == 1 and "/nonexistent.jsonl" in p.stderr, "missing prompt file")
    for args, needle in ((["--tree-budget", "0,999"], "--tree-budget"), (["--tree-budget", "-1"], "--tree-budget"),
                         (["--shard", "2/2"], "--shard"), (["--tree-budget", "4", "--temperature", "1"], "greedy"),
                         (["--format", "csv"], "--format")):
        p = dfl("eval", "--online", "--target", T, "--drafter", D1, "--prompts", GSM, "--out", os.path.join(tmp, "b5"), *args,
                check=False)
        t.check(p.returncode == 2 and needle in p.stderr, f"{args}: {p.stderr}")
    p = dfl("eval", "--online", "--help")
    t.check("usage: dfl eval" in p.stdout, "eval --help")
    p = dfl("eval-merge", "--help")
    t.check("usage: dfl eval-merge" in p.stdout, "eval-merge --help")


base = None
try:
    base = basic()
except Exception as e:  # noqa: BLE001
    t.check(False, f"basic: {e}")
if base:
    t.run(resume, base)
    t.run(shards, base)
def activations():
    """DFL_ACT=bf16 (where the CPU has AVX-512 BF16): every results line and the summaries say so; a
    resume, a merge or a replay of recorded features in the other mode is refused, naming the file."""
    if "act bf16" not in dfl("--version", env=dict(os.environ, DFL_ACT="bf16")).stdout:
        print("activations: this CPU has no AVX-512 BF16; DFL_ACT=bf16 not checked", flush=True)
        return
    bf = dict(os.environ, DFL_ACT="bf16")
    out, feat = os.path.join(tmp, "act-bf16"), os.path.join(tmp, "act-feat")
    args = ("--target", T, "--drafter", D1, "--prompts", GSM, "--limit", 2, "--max-new", 12, "--tree-budget", "0,4")
    dfl("eval", *args, "--out", out, "--save-features", feat, env=bf)
    rs = lines(out)
    t.check(len(rs) > 0 and all(r.get("act") == "bf16" for r in rs), "bf16 run: every results line has act bf16")
    t.check(summary(out)["activations"] == "bf16", "bf16 run: summary.json activations bf16")
    t.check("Computed with bf16 activations" in open(os.path.join(out, "summary.md")).read(), "summary.md says bf16")
    p = dfl("eval", *args, "--out", out, "--resume", check=False)
    t.check(p.returncode != 0 and "results.jsonl:1" in p.stderr and "bf16 activations" in p.stderr,
            f"resume of a bf16 run in f32 refused: {p.stderr.strip()[-300:]}")
    p = dfl("eval", "--features", feat, "--drafter", D1, "--out", os.path.join(tmp, "act-replay"), check=False)
    t.check(p.returncode != 0 and "recorded with bf16 activations" in p.stderr,
            f"replay of bf16 features in f32 refused: {p.stderr.strip()[-300:]}")
    dfl("eval", "--features", feat, "--drafter", D1, "--out", os.path.join(tmp, "act-replay-bf16"), env=bf)
    f32 = os.path.join(tmp, "act-f32")
    dfl("eval", *args, "--out", f32)
    t.check(summary(f32)["activations"] == "f32" and all("act" not in r for r in lines(f32)),
            "f32 run: activations f32, no act field")
    cmp = json.loads(dfl("eval-compare", f32, out, "--json").stdout)
    t.check([r["activations"] for r in cmp["runs"]] == ["f32", "bf16"], f"eval-compare names the modes: {cmp['runs']}")
    p = dfl("eval-merge", "--out", os.path.join(tmp, "act-merged"), f32, out, check=False)
    t.check(p.returncode != 0 and "must not mix" in p.stderr, f"merging f32 and bf16 runs refused: {p.stderr.strip()[-300:]}")


def accept_rules():
    """Temperature > 0: both acceptance rules run, summary.json says which was used, and tau differs
    as expected: on the embedded pair the drafter's q is close to the target's p, so speculative
    sampling (accepts with probability sum min(p, q) = 1 - TV(p, q)) keeps more drafts than the match
    rule (a greedy draft survives only when the target's sample equals it: max p). Seeded: the same
    numbers every run. Losslessness in distribution is unit.test_spec's chi-square."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    et, ed = os.path.join(root, "models", "target"), os.path.join(root, "models", "drafter")
    prompts = os.path.join(root, "data", "gsm8k_test_40.jsonl")
    tau = {}
    for rule in ("pq", "match"):
        out = os.path.join(tmp, f"rule-{rule}")
        dfl("eval", "--online", "--target", et, "--drafter", ed, "--prompts", prompts, "--limit", 6, "--max-new", 128,
            "--temperature", 1, "--seed", 5, "--accept-rule", rule, "--out", out, "--progress", "none")
        s = summary(out)
        t.check(s["run"]["accept_rule"] == rule, f"summary.json run.accept_rule {s['run'].get('accept_rule')} != {rule}")
        tau[rule] = [r["tau_token_weighted"] for r in s["results"] if r["mode"] == "chain"][0]
    t.check(tau["pq"] > tau["match"], f"T=1: tau pq {tau['pq']:.3f} should exceed match {tau['match']:.3f}")
    s = summary(os.path.join(tmp, "basic")) if os.path.isdir(os.path.join(tmp, "basic")) else None
    t.check(s is None or s["run"]["accept_rule"] == "greedy", "temperature 0: accept_rule greedy")
    p = dfl("eval", "--target", et, "--drafter", ed, "--prompts", prompts, "--accept-rule", "maybe", "--out",
            os.path.join(tmp, "rule-bad"), check=False)
    t.check(p.returncode == 2 and "--accept-rule" in p.stderr, f"--accept-rule maybe: {p.stderr[-200:]}")


def devices():
    """--device: summary.json names the device the target ran on (cpu here; results lines carry
    "device" only off the CPU, so CPU results are as before); results marked with another device
    (as a `--device cuda` run writes them) are refused on --resume, named in a merge's summary.json
    and summary.md, and refused mixed with CPU results; replaying features recorded on another
    device marks the results with it, and truths of two devices are refused together."""
    out, feat = os.path.join(tmp, "dev-cpu"), os.path.join(tmp, "dev-feat")
    args = ("--target", T, "--drafter", D1, "--prompts", GSM, "--limit", 2, "--max-new", 12, "--progress", "none")
    dfl("eval", *args, "--out", out, "--save-features", feat)
    t.check(summary(out)["device"] == "cpu" and all("device" not in r for r in lines(out)),
            "cpu run: summary.json device cpu, no device field in the results")
    t.check("Target on" not in open(os.path.join(out, "summary.md")).read(), "cpu run: summary.md says nothing")
    cu = os.path.join(tmp, "dev-cuda")
    os.makedirs(cu)
    shutil.copy(os.path.join(out, "run.json"), cu)  # what the run ran: eval-merge and --resume compare it
    with open(os.path.join(out, "results.jsonl")) as f, open(os.path.join(cu, "results.jsonl"), "w") as g:
        for x in f:
            g.write(x.replace('{"prompt_id": ', '{"device": "cuda", "prompt_id": ', 1))
    p = dfl("eval", *args, "--out", cu, "--resume", check=False)
    t.check(p.returncode == 1 and "results.jsonl:1" in p.stderr and "ran on cuda" in p.stderr and
            "--device" in p.stderr, f"resume of a cuda run on the cpu refused: {p.stderr.strip()[-300:]}")
    merged = os.path.join(tmp, "dev-merged")
    dfl("eval-merge", "--out", merged, cu)
    t.check(summary(merged)["device"] == "cuda" and all(r.get("device") == "cuda" for r in lines(merged)),
            "merge of a cuda run: summary.json device cuda, every line kept")
    t.check("**Target on cuda**" in open(os.path.join(merged, "summary.md")).read(), "summary.md names cuda")
    p = dfl("eval-merge", "--out", os.path.join(tmp, "dev-mixed"), out, cu, check=False)
    t.check(p.returncode != 0 and "must not mix" in p.stderr and "cuda" in p.stderr,
            f"merging cpu and cuda results refused: {p.stderr.strip()[-300:]}")
    bad = os.path.join(tmp, "dev-bad")
    os.makedirs(bad)
    shutil.copy(os.path.join(out, "run.json"), bad)
    with open(os.path.join(bad, "results.jsonl"), "w") as g:
        g.write(open(os.path.join(cu, "results.jsonl")).readline().replace('"cuda"', '"tpu"'))
    p = dfl("eval-merge", "--out", os.path.join(tmp, "dev-bad-m"), bad, check=False)
    t.check(p.returncode != 0 and "field device" in p.stderr, f"device tpu refused: {p.stderr.strip()[-300:]}")

    # features recorded on cuda: __metadata__ "device" (absent on the cpu)
    files = sorted(x for x in os.listdir(feat) if x.endswith(".safetensors"))
    t.check(len(files) >= 2 and all("device" not in st_read_raw(os.path.join(feat, x))[1]["__metadata__"]
                                    for x in files), f"cpu features carry no device: {files}")

    def mark(path, dev):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
            data = f.read()
        hdr["__metadata__"]["device"] = dev
        h = json.dumps(hdr).encode()
        h += b" " * (-len(h) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + data)

    fc = os.path.join(tmp, "dev-feat-cuda")
    shutil.copytree(feat, fc)
    for x in files:
        mark(os.path.join(fc, x), "cuda")
    rp = os.path.join(tmp, "dev-replay-cuda")
    dfl("eval", "--features", fc, "--drafter", D1, "--out", rp, "--progress", "none")
    t.check(summary(rp)["device"] == "cuda" and all(r.get("device") == "cuda" for r in lines(rp)),
            "replay of cuda features: marked cuda")
    mark(os.path.join(fc, files[-1]), "cpu")
    p = dfl("eval", "--features", fc, "--drafter", D1, "--out", os.path.join(tmp, "dev-replay-mixed"), check=False)
    t.check(p.returncode == 1 and files[-1] in p.stderr and "recorded with the target on cpu" in p.stderr,
            f"features of two devices refused: {p.stderr.strip()[-300:]}")


def tau_names():
    """One definition per name: generate's `tau` of a response equals eval's per-response `tau`
    of the same response, and both tools' `tau_accept` is 1 + accepted / rounds."""
    gsm40 = os.path.join(SOURCE, "data", "gsm8k_test_40.jsonl")
    with open(gsm40) as f:
        text = json.loads(f.readline())["question"]
    et, ed = os.path.join(SOURCE, "models", "target"), os.path.join(SOURCE, "models", "drafter")
    out = os.path.join(tmp, "tau-names")
    dfl("eval", "--online", "--target", et, "--drafter", ed, "--prompts", gsm40, "--limit", 1, "--chat", "chatml",
        "--max-new", 23, "--out", out)
    ev = [r for r in lines(out) if r["mode"] == "chain"][0]
    g = dfl_json("generate", "--target", et, "--drafter", ed, "--prompt", text, "--chat", "chatml", "--max-new", 23,
                 "--json")["stats"]
    t.check(g["generated_tokens"] == ev["tokens"] and g["rounds"] == ev["rounds"] and g["accepted"] == ev["accepted"],
            f"the same response: generate {g['generated_tokens']} tokens / {g['rounds']} rounds, eval {ev}")
    t.check(g["accepted"] > 0, f"the embedded pair accepts drafts here: {g}")
    t.check(abs(g["tau"] - ev["tau"]) < 1e-6 and abs(g["tau"] - (ev["tokens"] - 1) / ev["rounds"]) < 1e-6,
            f"tau: generate {g['tau']}, eval {ev['tau']}")
    t.check(abs(g["tau_accept"] - (1 + g["accepted"] / g["rounds"])) < 1e-6 and "tau_token_weighted" not in g,
            f"generate's tau_accept {g.get('tau_accept')}, members {sorted(g)}")
    print(f"one response: tau {g['tau']:.4f} in generate and eval, tau_accept {g['tau_accept']:.4f}", flush=True)


t.run(tau_names)
t.run(plots)
t.run(moe)
t.run(accept_rules)
t.run(activations)
t.run(devices)
t.run(repeat)
t.run(how_to_read)
t.run(mtbench)
t.run(reference_file)
t.run(reference_url)
t.run(bad_input)
t.done()
