"""Times every Table III workload alone (no MPS) at the given batch sizes, in one process:
ms per iteration and peak memory. Used to choose the batch sizes and the measurement window
of lab/scripts/gpu/measure-plan.yaml.

  python3 lab/scripts/gpu/measure-probe.py OUT.jsonl [BATCH_SMALL BATCH_LARGE]
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import workloads  # noqa: E402

BATCHES = {"bert-train": (8, 16), "resnet152-train": (16, 32), "densenet201-train": (16, 32),
           "transformer-inf": (16, 32), "transformer-train": (16, 32)}


def main():
    out = open(sys.argv[1], "w")
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                      "gpu": torch.cuda.get_device_name(0)}), file=out, flush=True)
    w = workloads.Worker()
    for name in workloads.WORKLOADS:
        for batch in BATCHES.get(name, (32, 64)):
            t = time.monotonic()
            try:
                prep = w.prepare({"workload": name, "batch": batch})
                build_s = time.monotonic() - t
                now = time.monotonic()
                r = w.measure({"workload": name, "batch": batch, "start": now, "end": now + 1.0})
                its = [d for _, d in r["iters"]]
                rec = {"workload": name, "batch": batch, "build_s": round(build_s, 2),
                       "ms": round(1000 * sum(its) / max(1, len(its)), 2), "n": len(its),
                       "mem_gib": round(prep["mem_bytes"] / 2**30, 2)}
            except Exception as e:  # noqa: BLE001
                rec = {"workload": name, "batch": batch, "error": str(e)[:200]}
            print(json.dumps(rec), file=out, flush=True)
            print(json.dumps(rec), flush=True)
        w.drop(None)


if __name__ == "__main__":
    main()
