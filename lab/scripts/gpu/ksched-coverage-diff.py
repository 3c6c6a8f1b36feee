"""Which kernels CUPTI saw that the interposer did not (or the other way round).

  python3 ksched-coverage-diff.py TRACE.csv CUPTI.json

TRACE.csv is the interposer's record-mode trace of the run; CUPTI.json is what
ksched-workloads.py wrote (the launch-counter region and CUPTI's per-kernel counts). Names
are compared demangled, as CUPTI reports them.
"""
import csv
import json
import subprocess
import sys
from collections import Counter

trace_path, cupti_path = sys.argv[1], sys.argv[2]
cupti = json.load(open(cupti_path))
lo, hi = cupti["region"]
ours = Counter()
with open(trace_path) as f:
    for row in csv.DictReader(f):
        if lo <= int(row["seq"]) < hi:
            ours[row["kernel"]] += 1
mangled = list(ours)
demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True,
                           text=True).stdout.splitlines()
ours_d = Counter()
for m, d in zip(mangled, demangled):
    ours_d[d] += ours[m]
theirs = Counter(cupti["cupti"])
diff = []
for name in set(ours_d) | set(theirs):
    if ours_d[name] != theirs[name]:
        diff.append((theirs[name] - ours_d[name], theirs[name], ours_d[name], name[:160]))
diff.sort(reverse=True)
print(json.dumps({"trace_launches": sum(ours.values()), "cupti_kernels": sum(theirs.values()),
                  "differences": [{"cupti": t, "interposer": o, "kernel": n}
                                  for _, t, o, n in diff[:15]]}))
