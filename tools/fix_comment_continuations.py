"""Re-align the continuation lines of a trailing block comment under its first line.

clang-format aligns trailing comments (`int n;   /* ...`) but leaves the comment's further lines
(` * ...`) where they were; this puts each one under the `/*` again. tools/format.sh runs it
after clang-format; the result is what clang-format --dry-run accepts.
    python3 tools/fix_comment_continuations.py FILE..."""
import re
import sys


def fix(lines):
    changed, i = False, 0
    while i < len(lines):
        line = lines[i]
        col = line.find("/*")
        opened = col > 0 and line[:col].strip() and "*/" not in line[col:] and not line.rstrip().endswith("\\")
        if opened:
            k = i + 1
            while k < len(lines):
                m = re.match(r"^(\s*)\*", lines[k])
                if not m:
                    break
                new = " " * (col + 1) + lines[k][len(m.group(1)):]
                changed |= new != lines[k]
                lines[k] = new
                if "*/" in lines[k]:
                    break
                k += 1
            i = k
        i += 1
    return changed


for path in sys.argv[1:]:
    with open(path) as f:
        lines = f.read().split("\n")
    if fix(lines):
        with open(path, "w") as f:
            f.write("\n".join(lines))
