#!/usr/bin/env python3
"""Summarise `cuobjdump -sass` output: for each function whose name contains a pattern, its
instruction count by opcode, then the listing of the first such function.

    python3 tools/sass_summary.py sass_all.txt moe_mma_kernel
"""
import collections
import re
import sys


def main() -> int:
    path, pattern = sys.argv[1], sys.argv[2]
    funcs: dict[str, list[str]] = {}
    name = None
    for line in open(path, errors="replace"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            funcs[name] = []
            continue
        if name is not None and re.match(r"\s*/\*[0-9a-f]{4}\*/", line):
            funcs[name].append(line.rstrip())
    chosen = [n for n in funcs if pattern in n]
    if not chosen:
        print(f"no function matching {pattern!r} among {len(funcs)}")
        return 1
    for n in chosen:
        ops = collections.Counter()
        for line in funcs[n]:
            m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
            if m:
                ops[m.group(2).split(".")[0]] += 1
        total = sum(ops.values())
        print(f"== {n}: {total} instructions")
        print("   " + ", ".join(f"{op} {c}" for op, c in ops.most_common(24)))
    for n in chosen:
        print(f"\n== listing of {n}")
        print("\n".join(funcs[n]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
