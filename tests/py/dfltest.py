"""Shared helpers for the Python-driven tests: paths from ctest's environment, running dfl,
a tiny pass/fail tally that prints the closing 'N passed, N failed' line."""
import json
import os
import struct
import subprocess
import sys

SOURCE = os.environ.get("DFL_SOURCE", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DFL = os.environ.get("DFL_BIN", os.path.join(SOURCE, "build", "dfl"))
FIXTURES = os.environ.get("DFL_FIXTURES", os.path.join(SOURCE, "build", "fixtures"))
DATA = os.environ.get("DFL_DATA", os.path.join(SOURCE, "data"))  # tokenizers and datasets (data/README.md)
PY = sys.executable


def fixture(name):
    return os.path.join(FIXTURES, name)


def run(args, check=True, **kw):
    """Run a command; returns CompletedProcess with text output."""
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"command failed ({p.returncode}): {' '.join(map(str, args))}\n{p.stderr[-3000:]}")
    return p


def dfl(*args, check=True, **kw):
    return run([DFL, *map(str, args)], check=check, **kw)


def dfl_json(*args):
    return json.loads(dfl(*args).stdout)


def reference(*args):
    """tools/reference/hf_forward.py with these arguments; returns its JSON summary."""
    p = run([PY, os.path.join(SOURCE, "tools", "reference", "hf_forward.py"), *map(str, args)])
    return json.loads(p.stdout.strip().splitlines()[-1])


class Tally:
    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL: {what}", flush=True)
        return cond

    def run(self, fn, *args):
        """Run one sub-test; an exception counts as a failure with its message."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 — report and continue with the other cases
            self.failed += 1
            print(f"FAIL: {fn.__name__}{args}: {e}", flush=True)

    def done(self):
        print(f"{self.name}: {self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)


# ---- raw safetensors files, for tests that damage them ----

def st_read_raw(path):
    """(header length, header dict, data bytes) of a .safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        return n, hdr, f.read()


def st_write_raw(path, hdr, data, hlen=None):
    """Write a header dict and data bytes; hlen overrides the length field (a lie about the header)."""
    h = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", hlen if hlen is not None else len(h)))
        f.write(h)
        f.write(data)
