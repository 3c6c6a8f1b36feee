"""A managed job for lab/scripts/gpu/mps-smoke.sh: reports the SMs it sees and its matmul
throughput, then (optionally) checks that its MPS pinned-memory limit holds."""
import os
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
props = torch.cuda.get_device_properties(0)
share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "?")
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(10):
    c = a @ b
torch.cuda.synchronize()
iters = 0
start = time.perf_counter()
while time.perf_counter() - start < seconds:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    iters += 20
elapsed = time.perf_counter() - start
tflops = 2 * n**3 * iters / elapsed / 1e12
print(
    f"share={share} sms={props.multi_processor_count} of_gpu=132 tflops={tflops:.1f} "
    f"pipe={os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '-')} "
    f"memlimit={os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', '-')}",
    flush=True,
)
# More than the job's pinned-memory limit must fail under MPS.
limit = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
if limit.startswith("0=") and limit.endswith("M"):
    over = (int(limit[2:-1]) + 1024) * 2**20
    try:
        x = torch.empty(over, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print(f"over_limit_alloc=succeeded bytes={over}", flush=True)
    except RuntimeError as e:
        print(f"over_limit_alloc=refused ({str(e).splitlines()[0][:80]})", flush=True)
