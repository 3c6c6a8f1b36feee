"""Checks that the build after plans as the build before: the two scale runs of the last
round, and the paper's setup on seeds 51-53 (every policy) against the record that holds
that run of the build before (BEFORE below). Timings aside, every figure must be the
same. Then the wall times and peak memory of every round (times.txt). Prints check.md.

Usage: check.py [RECORD [BEFORE]]: RECORD is the folder of run.sh's output (this one by
default), BEFORE the folder of the record that holds the build before's paper run,
relative to the runs folder (2026-11-28-vm-holds by default)."""
import json
import os
import sys

runs = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
here = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(
    runs, "2026-11-29-vm-scale")
before_record = sys.argv[2] if len(sys.argv) > 2 else "2026-11-28-vm-holds"


def load(*path):
    with open(os.path.join(here, *path)) as f:
        return json.load(f)


def figures(p):
    return {k: v for k, v in p.items() if k != "seconds"}


before = load("scale-before.json")["policies"][0]
after = load("scale-after.json")["policies"][0]
print("| run | figures the same | seconds before (its record) | seconds after |")
print("| --- | --- | --- | --- |")
print(f"| 10,000 jobs, 128 GPUs, `mmk` | {figures(before) == figures(after)} | "
      f"{before['seconds']:.1f} | {after['seconds']:.1f} |")
old = load(runs, before_record, "paper-seeds-51-53.json")["runs"]
new = load("paper-seeds-51-53.json")["runs"]
same = sum(
    figures(a) == figures(b)
    for ra, rb in zip(old, new)
    for a, b in zip(ra["policies"], rb["policies"])
)
total = sum(len(r["policies"]) for r in old)
print(f"| paper setup, seeds 51-53, 20-160 s, every policy | {same} of {total} runs | "
      f"{sum(p['seconds'] for r in old for p in r['policies']):.1f} | "
      f"{sum(p['seconds'] for r in new for p in r['policies']):.1f} |")

print()
print("| round | before | after | after / before | peak memory before, after |")
print("| --- | --- | --- | --- | --- |")
rounds = {}
with open(os.path.join(here, "times.txt")) as f:
    for line in f:
        w = line.split()
        if len(w) == 7 and w[0] == "round":
            rounds.setdefault(w[1], {})[w[2]] = (float(w[3]), int(w[5]) // 1024)
for r, t in sorted(rounds.items()):
    (b, mb), (a, ma) = t["before"], t["after"]
    print(f"| {r} | {b:.1f} s | {a:.1f} s | {a / b:.2f} | {mb} MB, {ma} MB |")
