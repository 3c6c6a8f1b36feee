"""Does a CUDA graph capture work under the interposer and the kernel scheduler? (issue 7)

  python3 lab/scripts/gpu/ksched-capture.py OUT_DIR BIN_DIR [BIN_DIR ...]

For each BIN_DIR (libmmk_interposer.so and mmk-gate, release builds) and each job class,
runs one job under LD_PRELOAD with a gate (policy mmk, MIG and MPS untouched): ResNet-50
inference at batch 4, its forward pass captured with torch.cuda.graph (global capture
mode, as PyTorch does by default), then replayed 200 times. Writes
OUT_DIR/capture.json: per BIN_DIR and class, whether the capture worked, the error if
not, the largest difference between the replayed and the eager output, and the
interposer's stats (launches, captured, untracked).

  python3 lab/scripts/gpu/ksched-capture.py --job OUT.json   (the job itself)
"""
import json
import os
import subprocess
import sys
import tempfile


def job(out):
    import torch
    import torchvision

    model = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(4, 3, 224, 224, device="cuda")
    with torch.no_grad():
        for _ in range(5):
            model(x)
    torch.cuda.synchronize()
    result = {}
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(graph):
            y = model(x)
        for _ in range(200):
            graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            ref = model(x)
        result.update(captured=True, max_abs_diff=(ref - y).abs().max().item())
    except Exception as e:  # the capture's failure is the result
        result.update(captured=False, error=str(e).strip().splitlines()[0][:300])
    json.dump(result, open(out, "w"))


def main():
    if sys.argv[1] == "--job":
        job(sys.argv[2])
        return
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    results = []
    for bin_dir in sys.argv[2:]:
        bin_dir = os.path.abspath(bin_dir)
        for cls in ["online", "offline"]:
            work = tempfile.mkdtemp(prefix="mmk-capture-")
            gate = f"{work}/g.gate"
            subprocess.run([f"{bin_dir}/mmk-gate", "create", gate, "--sms", "132",
                            "--policy", "mmk"], check=True, capture_output=True)
            stats = f"{work}/stats.json"
            env = dict(os.environ, LD_PRELOAD=f"{bin_dir}/libmmk_interposer.so", MMK_GATE=gate,
                       MMK_JOB_CLASS=cls, MMK_KSCHED_STATS=stats)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--job",
                                f"{work}/job.json"], env=env, capture_output=True, text=True,
                               timeout=300)
            row = {"bin": os.path.basename(bin_dir), "class": cls, "exit": r.returncode}
            if os.path.exists(f"{work}/job.json"):
                row.update(json.load(open(f"{work}/job.json")))
            else:
                row["stderr"] = r.stderr[-1500:]
            if os.path.exists(stats):
                s = json.load(open(stats))
                row["stats"] = {k: s.get(k) for k in
                                ["launches", "captured", "untracked", "failed", "held", "by_api"]}
            print(json.dumps(row), flush=True)
            results.append(row)
    json.dump(results, open(f"{out}/capture.json", "w"), indent=1)


if __name__ == "__main__":
    main()
