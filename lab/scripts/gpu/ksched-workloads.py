"""Workloads for the interposer's checks on a GPU (lab/scripts/gpu/ksched-check.sh).

  python3 ksched-workloads.py coverage resnet50|bert   -> launches counted vs CUPTI kernels
  python3 ksched-workloads.py time resnet50|bert       -> median ms per iteration
  python3 ksched-workloads.py ab resnet50|bert         -> the same, interposer on vs paused,
                                                          alternating blocks in one process

Prints one JSON line. Under LD_PRELOAD=libmmk_interposer.so, `coverage` reads the
interposer's launch counter (mmk_interposer_launches) around a region that torch.profiler
(CUPTI) records, and compares the two counts.
"""
import ctypes
import json
import os
import statistics
import sys
import time

import torch


def resnet50():
    import torchvision

    model = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(8, 3, 224, 224, device="cuda")

    def step():
        with torch.no_grad():
            model(x)

    return step


def bert():
    """BERT-base masked-LM training, batch 8 x 128 (the same job as workloads.py's)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workloads

    return workloads.bert_train(8)


def interposer_launches():
    try:
        return ctypes.CDLL(None).mmk_interposer_launches()
    except AttributeError:
        return None


def main():
    mode, name = sys.argv[1], sys.argv[2]
    step = {"resnet50": resnet50, "bert": bert}[name]()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    result = {"workload": name, "mode": mode}
    if mode == "coverage":
        iters = 10 if name == "bert" else 20
        from torch.profiler import ProfilerActivity, profile

        before = interposer_launches()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                step()
            torch.cuda.synchronize()
        after = interposer_launches()
        kernels = 0
        names = {}
        for e in prof.events():
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            # record_function ranges projected onto the GPU timeline are not kernels.
            if getattr(e, "is_user_annotation", False) or e.name.startswith("Optimizer."):
                continue
            if e.name.startswith(("Memcpy", "Memset")):
                continue
            kernels += 1
            names[e.name] = names.get(e.name, 0) + 1
        counted = None if before is None else after - before
        result.update(iters=iters, cupti_kernels=kernels, interposer_launches=counted,
                      coverage=None if counted is None or kernels == 0 else counted / kernels,
                      distinct_kernels=len(names), region=[before, after])
        if len(sys.argv) > 3:  # per-kernel counts, for ksched-coverage-diff.py
            with open(sys.argv[3], "w") as f:
                json.dump({"region": [before, after], "cupti": names}, f)
    elif mode == "ab":
        lib = ctypes.CDLL(None)
        lib.mmk_interposer_set_enabled.argtypes = [ctypes.c_bool]
        per_block = 10 if name == "bert" else 40
        samples = {True: [], False: []}
        for block in range(16):
            on = block % 2 == 0
            lib.mmk_interposer_set_enabled(on)
            for _ in range(per_block):
                torch.cuda.synchronize()
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
                samples[on].append((time.perf_counter() - t) * 1e3)
        lib.mmk_interposer_set_enabled(True)
        on_ms, off_ms = statistics.median(samples[True]), statistics.median(samples[False])
        result.update(iters_each=len(samples[True]), on_median_ms=on_ms, off_median_ms=off_ms,
                      overhead=on_ms / off_ms - 1)
    else:
        iters = 20 if name == "bert" else 50
        times = []
        for _ in range(iters):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
        result.update(iters=iters, median_ms=statistics.median(times), min_ms=min(times))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
