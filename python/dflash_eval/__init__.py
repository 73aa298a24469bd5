"""dfl from Python (docs/python.md): ctypes bindings to libdfl.so, the C API of include/dfl/dfl_api.h.

    import dflash_eval as dfl
    summary = dfl.eval(target="models/target", drafter="models/drafter",
                       prompts="data/gsm8k_test_40.jsonl", limit=3, max_new=32)

The C code does the work; this module only converts arguments and results. ctypes releases the
GIL during every foreign call, so other Python threads run while dfl computes.
"""
import ctypes
import json
import os
import re
import shutil
import tempfile
import threading

__all__ = ["Error", "Target", "inspect", "hidden", "tokenize", "generate", "eval", "replay", "version", "record",
           "RecordError"]

# The shared libraries libdfl.so needs at run time (Debian/Ubuntu package names).
_SYSTEM_LIBS = {
    "libpcre2-8": "libpcre2-8-0",
    "libutf8proc": "libutf8proc2 (libutf8proc3 on newer releases)",
    "libcjson": "libcjson1",
    "libcurl": "libcurl4",
    "libmicrohttpd": "libmicrohttpd12",
    "libgomp": "libgomp1",
}


def _load():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libdfl.so")
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        msg = str(e)
        m = re.search(r"(lib[\w.+-]+?)\.so[\w.]*: cannot open shared object file", msg)
        if m and m.group(1) != "libdfl":
            name = m.group(1)
            pkg = _SYSTEM_LIBS.get(name, name)
            raise ImportError(f"dflash_eval: the system library {name} is missing ({msg}); install it with: "
                              f"apt-get install {pkg}") from None
        raise ImportError(f"dflash_eval: cannot load {path}: {msg}") from None


# libgomp reads its idle threads' spin count once, when it loads: dfl's default (DFL_GOMP_SPINCOUNT in
# include/dfl/kernels.h, docs/threads.md) unless the user chose a policy. Without effect where the
# process loaded libgomp before (torch, for one).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "3000"
_lib = _load()
_c = ctypes
_P = _c.POINTER
_lib.dfl_api_version.restype = _c.c_char_p
_lib.dfl_api_last_error.restype = _c.c_char_p
_lib.dfl_api_free.argtypes = [_c.c_void_p]
_lib.dfl_api_inspect.argtypes = [_c.c_char_p, _c.c_char_p, _c.c_int, _P(_c.c_void_p)]
_lib.dfl_api_target_open.argtypes = [_c.c_char_p, _P(_c.c_void_p)]
_lib.dfl_api_target_close.argtypes = [_c.c_void_p]
_lib.dfl_api_target_close.restype = None
_lib.dfl_api_target_dims.argtypes = [_c.c_void_p, _P(_c.c_int), _P(_c.c_int), _P(_c.c_int)]
_lib.dfl_api_tokenize.argtypes = [_c.c_void_p, _c.c_char_p, _c.c_char_p, _P(_P(_c.c_int32)), _P(_c.c_int)]
_lib.dfl_api_hidden.argtypes = [_c.c_void_p, _P(_c.c_int32), _c.c_int, _P(_c.c_int), _c.c_int, _c.c_void_p]
_lib.dfl_api_generate.argtypes = [_c.c_char_p, _P(_c.c_void_p)]
_PROGRESS = _c.CFUNCTYPE(None, _c.c_void_p, _c.c_int, _c.c_int, _c.c_char_p, _c.c_double)
_lib.dfl_api_eval.argtypes = [_c.c_char_p, _PROGRESS, _c.c_void_p, _P(_c.c_void_p)]
_lib.dfl_api_replay.argtypes = [_c.c_char_p, _c.c_char_p, _P(_c.c_int), _c.c_int, _c.c_char_p, _PROGRESS,
                                _c.c_void_p, _P(_c.c_void_p)]


class Error(Exception):
    """A failed dfl call; the message is dfl's (it names the field, expected vs found)."""


def version():
    return _lib.dfl_api_version().decode()


def _check(rc):
    if rc != 0:
        raise Error(_lib.dfl_api_last_error().decode(errors="replace"))


def _take_string(p):
    """A malloc'd C string handed out by the API, as a Python str (the C copy freed)."""
    try:
        return _c.string_at(p.value).decode()
    finally:
        _lib.dfl_api_free(p)


def _path(p, what):
    if not isinstance(p, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a path (str or os.PathLike), found {type(p).__name__}")
    return os.fsencode(p)


def inspect(path, target=None, check_weights=False):
    """The report of `dfl inspect PATH --json` as a dict (a drafter with target: its compatibility)."""
    out = _c.c_void_p()
    _check(_lib.dfl_api_inspect(_path(path, "path"), None if target is None else _path(target, "target"),
                                int(bool(check_weights)), _c.byref(out)))
    return json.loads(_take_string(out))


class Target:
    """A loaded target checkpoint (weights memory-mapped) for repeated hidden() calls. One thread
    uses it at a time: calls from several threads are serialized by a lock."""

    def __init__(self, path):
        h = _c.c_void_p()
        _check(_lib.dfl_api_target_open(_path(path, "target"), _c.byref(h)))
        self._h, self.path, self._lock = h, os.fspath(path), threading.Lock()
        n, hd, v = _c.c_int(), _c.c_int(), _c.c_int()
        _check(_lib.dfl_api_target_dims(h, _c.byref(n), _c.byref(hd), _c.byref(v)))
        self.num_layers, self.hidden_size, self.vocab_size = n.value, hd.value, v.value

    def close(self):
        if self._h:
            _lib.dfl_api_target_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _handle(self):
        if not self._h:
            raise Error("the target is closed")
        return self._h

    def tokenize(self, text, chat="none"):
        """Token ids of text with the checkpoint's tokenizer (chat: chatml, chatml-nothink, none)."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, found {type(text).__name__}")
        ids, n = _P(_c.c_int32)(), _c.c_int()
        with self._lock:
            _check(_lib.dfl_api_tokenize(self._handle(), text.encode(), chat.encode(), _c.byref(ids), _c.byref(n)))
        try:
            return [ids[i] for i in range(n.value)]
        finally:
            _lib.dfl_api_free(ids)

    def hidden(self, ids, layers):
        """{layer: float32 array [len(ids), hidden_size]}: the outputs of those decoder layers
        (transformers' hidden_states[layer + 1]) over the tokens. ids: token ids or a text."""
        import numpy as np

        if isinstance(ids, str):
            ids = self.tokenize(ids)
        if isinstance(layers, int):
            layers = [layers]
        ids = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        lay = np.ascontiguousarray(layers, dtype=np.intc).reshape(-1)
        out = np.empty((len(lay), len(ids), self.hidden_size), dtype=np.float32)
        with self._lock:
            _check(_lib.dfl_api_hidden(self._handle(), ids.ctypes.data_as(_P(_c.c_int32)), len(ids),
                                       lay.ctypes.data_as(_P(_c.c_int)), len(lay), out.ctypes.data))
        return {int(k): out[i] for i, k in enumerate(lay)}


def hidden(target, ids, layers):
    """{layer: numpy array [T, H]} for token ids (or a text) at decoder layers; target: a path or a Target."""
    if isinstance(target, Target):
        return target.hidden(ids, layers)
    with Target(target) as t:
        return t.hidden(ids, layers)


def tokenize(target, text, chat="none"):
    with Target(target) as t:
        return t.tokenize(text, chat)


def _options(kw):
    """Keyword arguments as the API's JSON options (paths as strings, None left out)."""
    o = {}
    for k, v in kw.items():
        if v is None:
            continue
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        elif isinstance(v, (list, tuple)):
            v = [os.fspath(x) if isinstance(x, os.PathLike) else x for x in v]
        o[k] = v
    return json.dumps(o).encode()


def generate(target, prompt=None, *, prompt_ids=None, drafter=None, **options):
    """`dfl generate --json`: {"tokens", "text", "unknown_ids", "stats"}. options: tokenizer, chat,
    max_new, max_context, block_size, tree_budget, block_attn, temperature, seed, top_p, top_k, accept_rule,
    ignore_eos."""
    out = _c.c_void_p()
    _check(_lib.dfl_api_generate(_options(dict(target=target, prompt=prompt, prompt_ids=prompt_ids,
                                                    drafter=drafter, **options)), _c.byref(out)))
    return json.loads(_take_string(out))


def _progress_callback(progress):
    """progress(done, total, what, last_tau) as a C callback; an exception it raises is kept and
    raised when the call returns (the run itself cannot be stopped from the callback)."""
    errors = []

    def call(_ud, done, total, what, last_tau):
        try:
            progress(done, total, what.decode(errors="replace") if what else "", last_tau)
        except BaseException as e:  # noqa: BLE001 — raised again after the C call
            errors.append(e)

    return _PROGRESS(call) if progress else _PROGRESS(), errors


def _run_eval(fn, out, progress):
    tmp = None
    if out is None:
        tmp = out = tempfile.mkdtemp(prefix="dfl-eval-")
    cb, errors = _progress_callback(progress)
    res = _c.c_void_p()
    try:
        _check(fn(out, cb, res))
        summary = json.loads(_take_string(res))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if errors:
        raise errors[0]
    return summary


def eval(target=None, drafter=None, prompts=None, *, out=None, progress=None, **options):
    """`dfl eval`: the summary.json dict. drafter: a path or a list of them; options: dfl eval's
    options without the dashes, '-' as '_' (limit, max_new, tree_budget=[0, 8], online=True,
    features=DIR, save_features=DIR, ...). out: the output directory (default: a temporary one,
    removed afterwards). progress(done, total, what, last_tau): called after each prompt."""
    def fn(o, cb, res):
        opts = _options(dict(target=target, drafter=drafter, prompts=prompts, out=o, **options))
        return _lib.dfl_api_eval(opts, cb, None, _c.byref(res))
    return _run_eval(fn, out, progress)


def replay(features_dir, drafter, budgets=(0,), *, out=None, progress=None, **options):
    """Score a drafter on saved features (`dfl eval --features DIR`), no target forward: the
    summary.json dict. budgets: the modes, 0 = chain, N = DDTree-N."""
    if isinstance(budgets, int):
        budgets = [budgets]
    arr = (_c.c_int * len(budgets))(*budgets)

    def fn(o, cb, res):
        return _lib.dfl_api_replay(_path(features_dir, "features_dir"), _path(drafter, "drafter"), arr, len(budgets),
                                   _options(dict(out=o, **options)), cb, None, _c.byref(res))
    return _run_eval(fn, out, progress)


def __getattr__(name):
    """record and RecordError: the transformers recorder (recorder.py, the "record" extra), imported on
    first use (torch and transformers only when record() runs; `python -m dflash_eval.recorder` runs
    it as a script without a second copy)."""
    if name in ("record", "RecordError"):
        from . import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'dflash_eval' has no attribute {name!r}")
