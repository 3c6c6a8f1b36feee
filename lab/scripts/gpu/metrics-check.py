"""mmkd's GPU-time attribution on a real GPU, against what the jobs measure themselves.

`mmkd --backend nvml` with its defaults and metrics on 127.0.0.1:9410; a ResNet-50 service
(batch 4, Poisson arrivals every 12 ms, CUDA events around each request's work:
`--gpu-time`) and a training of one ~1 ms kernel at a time (`--kind spin --sync-each`),
both started with `mmkctl run`. Two scrapes of /metrics 10 s apart while both run give
each job's GPU time per second (`mmk_job_gpu_kernel_seconds_total`); the service's own
CUDA-event time over the same window and the training's steps say what it should be.
`mmkctl top --once` runs in between. Writes OUT/metrics-check.json, the scrapes, the frame
and mmkd's log; no GPU setting is changed.

  python3 lab/scripts/gpu/metrics-check.py BIN_DIR OUT_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import import_module

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
APP = os.path.join(HERE, "colocate.py")
Mmkd = import_module("default-path").Mmkd
wait_file_line = import_module("default-path").wait_file_line


def scrape():
    text = urllib.request.urlopen("http://127.0.0.1:9410/metrics", timeout=10).read().decode()
    kernel = {}
    for line in text.splitlines():
        if line.startswith("mmk_job_gpu_kernel_seconds_total{"):
            name = line.split('name="', 1)[1].split('"', 1)[0]
            kernel[name] = float(line.rsplit(" ", 1)[1])
    return time.monotonic(), kernel, text


def main():
    bin_dir, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mmk-metrics-check-")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MMK_", "CUDA_MPS_"))} | {"PYTHONUNBUFFERED": "1"}
    m = Mmkd(bin_dir, work, ["--metrics", "127.0.0.1:9410"], env, f"{out}/mmkd.log")
    procs = []
    res = {"gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                  "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip(), "date": time.strftime("%Y-%m-%d")}
    try:
        procs.append(m.run("offline", "8G", "spin", [sys.executable, APP, "train", "--kind", "spin",
                                                       "--kernel-us", "1000", "--sync-each",
                                                       "--seconds", "600", "--out", f"{work}/train.json"]))
        m.wait_running("spin", 120)
        wait_file_line(f"{out}/spin.err", "train: warm", 240)
        procs.append(m.run("online", "16G", "serve", [sys.executable, APP, "serve", "--batch", "4",
                                                       "--interval-ms", "12", "--seconds", "25",
                                                       "--gpu-time", "--out", f"{work}/serve.json"]))
        m.wait_running("serve", 120)
        wait_file_line(f"{out}/serve.err", "serve: warm", 240)
        time.sleep(3)
        t_a, k_a, text_a = scrape()
        top = subprocess.run([m.ctl_bin, "--socket", m.sock, "top", "--once"], capture_output=True,
                             text=True, env=env)
        open(f"{out}/top.txt", "w").write(top.stdout + top.stderr)
        time.sleep(10)
        t_b, k_b, text_b = scrape()
        open(f"{out}/metrics-a.txt", "w").write(text_a)
        open(f"{out}/metrics-b.txt", "w").write(text_b)
        procs[1].wait(timeout=300)
        procs[0].terminate()
        procs[0].wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        m.stop()
    s = json.load(open(f"{work}/serve.json"))
    # The service's GPU time is the CUDA-event time of its requests' work over its measured
    # window [t0, t1]; arrivals are Poisson, so the scrape window gets its share of it.
    gpu = s.get("gpu_s", [])
    share = max(0.0, min(t_b, s["t1"]) - max(t_a, s["t0"])) / max(1e-9, s["t1"] - s["t0"])
    served = sum(gpu) * share
    tr = json.load(open(f"{work}/train.json"))
    steps = [e for e in tr["step_ends_s"] if t_a <= e <= t_b]
    dt = t_b - t_a
    res["window_s"] = dt
    res["mmk_gpu_frac"] = {n: (k_b.get(n, 0) - k_a.get(n, 0)) / dt for n in set(k_a) | set(k_b)}
    res["serve_cuda_event_frac"] = served / dt
    res["spin_kernel_us"] = tr.get("kernel_us")
    res["spin_steps_per_s"] = len(steps) / dt
    res["top"] = open(f"{out}/top.txt").read()
    json.dump(res, open(f"{out}/metrics-check.json", "w"), indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
