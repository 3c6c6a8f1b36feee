"""What mmkd learns of a job's DRAM bandwidth on a real GPU: two jobs started one after the
other with `mmkctl run` and no profile against `mmkd --backend nvml` (defaults otherwise),
each alone on the GPU for about 12 s: `stream` doubles a 2 GiB buffer into another, a kernel
that streams DRAM (a plain `copy_` would be a memcpy, no kernel for the interposer), `matmul`
multiplies bf16 matrices (compute-bound). Writes OUT/bandwidth-check.json with what
`mmkctl profiles` says of each (`dram_bw`, the share of the GPU's DRAM bandwidth GPM saw
while the job ran alone; `sm_mean`, `busy`) and mmkd's log. Changes no GPU setting.

  python3 lab/scripts/gpu/bandwidth-check.py BIN_DIR OUT_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import import_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
Mmkd = import_module("ksched-mmkd").Mmkd

JOBS = {
    "stream": """
import time, torch
x = torch.ones(2**29, device='cuda'); y = torch.empty_like(x)
end = time.time() + 12
while time.time() < end:
    for _ in range(50): torch.mul(x, 2.0, out=y)
    torch.cuda.synchronize()
""",
    "matmul": """
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.time() + 12
while time.time() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
""",
}


def main():
    bin_dir, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mmk-bw-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMK_", "CUDA_MPS_"))}
    m = Mmkd(bin_dir, work, [], env, f"{out}/mmkd.log")
    res = {"gpu": subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,mig.mode.current", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip(), "date": time.strftime("%Y-%m-%d"), "jobs": {}}
    try:
        for name, code in JOBS.items():
            t = time.time()
            r = subprocess.run([m.ctl_bin, "--socket", m.sock, "run", "--offline", "--memory", "8G",
                                "--name", name, "--", sys.executable, "-c", code],
                               env=env, capture_output=True, text=True, timeout=300)
            res["jobs"][name] = {"exit": r.returncode, "wall_s": round(time.time() - t, 1),
                                 "stderr_tail": r.stderr[-500:]}
        # The sampler reports at a job's end; give the store a moment.
        time.sleep(2)
        for p in m.ctl("profiles"):
            if p["name"] in res["jobs"]:
                res["jobs"][p["name"]]["profile"] = {
                    k: p.get(k) for k in ("dram_bw", "sm_mean", "busy", "samples", "seconds",
                                          "memory_peak_mib", "confident")}
    finally:
        m.stop()
    json.dump(res, open(f"{out}/bandwidth-check.json", "w"), indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
