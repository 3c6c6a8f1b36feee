#!/usr/bin/env bash
# What the CUDA toolkit, the driver and PyTorch on the GPU machine export and import around
# kernel launches: the facts the interposer's hook list is built from.
# Usage (on the GPU machine): lab/scripts/gpu/cuda-symbols.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp}}
{
echo "== nvcc"; nvcc --version | tail -2
inc=$(dirname "$(command -v nvcc)")/../include
[ -d "$inc" ] || inc=/usr/local/cuda/include
echo "== __cudaLaunchKernel in $inc"
grep -rn "__cudaLaunchKernel" "$inc" | head -20
grep -n -B2 -A12 "define __cudaLaunch\b\|define __cudaLaunch(" "$inc/crt/host_runtime.h" | head -60
echo "== runtime launch declarations"
grep -n -E "extern __host__.*(cudaLaunchKernel|cudaLaunchKernelExC|cudaLaunchCooperativeKernel|cudaGraphLaunch|cudaGetFuncBySymbol|cudaGetDriverEntryPoint)\b" "$inc/cuda_runtime_api.h" | head -20
torchlib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
cudart=$(python3 - <<'PY'
import glob, os, torch
import nvidia
for d in nvidia.__path__:
    for p in glob.glob(os.path.join(d, "**", "libcudart.so*"), recursive=True):
        print(p); break
PY
)
echo "== libcudart: $cudart"
nm -D --defined-only $cudart 2>/dev/null | grep -i -E "launch|GetProcAddress|EntryPoint|FuncBySymbol" | head -40
libcuda=$(ldconfig -p | awk '/libcuda.so.1/ {print $NF; exit}')
echo "== libcuda: $libcuda"
nm -D --defined-only $libcuda | grep -E " cu(Launch|GraphLaunch|GetProcAddress|FuncGetName|KernelGetName|KernelGetFunction|EventElapsedTime|EventDestroy|EventRecord)" | head -40
echo "== libtorch_cuda imports"
nm -D --undefined-only $torchlib/libtorch_cuda.so | grep -i -E "launch|GetProcAddress|EntryPoint" | head -20
echo "== libs that import cuLaunch* or cudaLaunch*"
for f in $(python3 -c 'import nvidia,glob,os; [print(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d,"**","*.so*"),recursive=True)]') $torchlib/*.so; do
  n=$(nm -D --undefined-only "$f" 2>/dev/null | grep -c -E "cu(da)?Launch|__cudaLaunch|cuGetProcAddress|cudaGetDriverEntryPoint")
  [ "$n" -gt 0 ] && echo "$n $(basename $f): $(nm -D --undefined-only $f | grep -E 'cu(da)?Launch|__cudaLaunch|cuGetProcAddress|cudaGetDriverEntryPoint' | awk '{print $2}' | tr '\n' ' ')"
done
} 2>&1 | tee "$out/cuda-symbols.txt"
