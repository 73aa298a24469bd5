"""Run by test_python_api.py with the fresh venv's interpreter: every dflash_eval call it checks,
results as one JSON line on stdout. argv[1]: {"tmp", "target", "drafter", "prompts", "features"}."""
import json
import os
import sys
import threading

import dflash_eval as dfl

a = json.loads(sys.argv[1])
res = {"module": dfl.__file__}
progress = []
res["eval"] = dfl.eval(a["target"], a["drafter"], a["prompts"], limit=3, max_new=32, tree_budget=[0, 4],
                       out=os.path.join(a["tmp"], "api-eval"), save_features=os.path.join(a["tmp"], "api-features"),
                       progress=lambda done, total, what, tau: progress.append([done, total]))
res["progress"] = progress
res["replay"] = dfl.replay(a["features"], a["drafter"], [0, 4, 8], out=os.path.join(a["tmp"], "api-replay"))

# two threads at once (ctypes releases the GIL: both run in C together)
out = {}


def replay_in_thread(name):
    out[name] = dfl.replay(a["features"], a["drafter"], [0, 4, 8], out=os.path.join(a["tmp"], "api-" + name),
                           quiet=True)


ths = [threading.Thread(target=replay_in_thread, args=(n,)) for n in ("replay_a", "replay_b")]
for th in ths:
    th.start()
for th in ths:
    th.join()
res.update(out)

h = dfl.hidden(a["target"], [1, 2, 3, 4, 5], [1, 5])
res["hidden_bytes"] = {str(k): v.tobytes().hex() for k, v in h.items()}
res["generate"] = dfl.generate(a["target"], "The sum of 2 and 3 is", drafter=a["drafter"], max_new=24)
res["inspect"] = dfl.inspect(a["drafter"], target=a["target"])


def error_of(fn):
    try:
        fn()
    except dfl.Error as e:
        return f"Error: {e}"
    except Exception as e:  # noqa: BLE001 — reported: the test wants dfl.Error
        return f"{type(e).__name__}: {e}"
    return "no error"


def stop(*_):
    raise ValueError("stop")


res["errors"] = {
    "limit": error_of(lambda: dfl.eval(a["target"], a["drafter"], a["prompts"], limit="three")),
    "unknown": error_of(lambda: dfl.eval(a["target"], a["drafter"], a["prompts"], max_tokens=3)),
    "layer": error_of(lambda: dfl.hidden(a["target"], [1, 2], [99])),
    "no_target": error_of(lambda: dfl.inspect(os.path.join(a["tmp"], "nonexistent"))),
    "features": error_of(lambda: dfl.replay(os.path.join(a["tmp"], "nonexistent"), a["drafter"], [0])),
    "no_prompt": error_of(lambda: dfl.generate(a["target"])),
    "bad_json_type": error_of(lambda: dfl.eval(a["target"], a["drafter"], a["prompts"], online="yes")),
}
res["callback_error"] = error_of(lambda: dfl.eval(a["target"], a["drafter"], a["prompts"], limit=1, max_new=8,
                                                  progress=stop)).replace("no error", "none")
print(json.dumps(res))
