"""The `dfl` console script: runs the dfl executable bundled in the package."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "dfl")
    if not os.access(exe, os.X_OK):
        sys.exit(f"dfl: the bundled executable {exe} is missing (a broken install: pip install --force-reinstall dflash-eval)")
    os.execv(exe, [exe, *sys.argv[1:]])
