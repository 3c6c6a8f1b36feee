"""Seeds 1-3 (this folder) and 4-5 (seeds-4-5/) of each 8- and 32-GPU case as one sweep per
case, and 128 GPUs (seed 1) as it is, into OUT/CASE.json:

  python3 merge.py OUT && RUNS_DIR=OUT python3 ../2026-11-26-vm-generalization/best.py"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
for case in ["h100", "h200", "a100-40gb", "a30", "online10", "online50", "online90", "gpus32"]:
    a = json.load(open(os.path.join(HERE, f"{case}.json")))
    b = json.load(open(os.path.join(HERE, "seeds-4-5", f"{case}.json")))
    a["runs"] += b["runs"]
    json.dump(a, open(os.path.join(OUT, f"{case}.json"), "w"))
shutil.copy(os.path.join(HERE, "gpus128.json"), os.path.join(OUT, "gpus128.json"))
