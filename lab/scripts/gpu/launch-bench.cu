// Per-launch cost on the host: each launch call of an empty kernel timed on its own,
// through the runtime (<<<>>>, which CUDA 13 compiles to __cudaLaunchKernel) and through the
// driver (cuLaunchKernel found with cudaGetDriverEntryPoint, as libraries do).
// Run it with and without LD_PRELOAD=libmmk_interposer.so; the difference is what the
// interposer adds. Prints one JSON line.
//   nvcc -O2 -o launch-bench launch-bench.cu && ./launch-bench [launches]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>
#include <vector>

__global__ void empty(int) {}

static double pct(std::vector<double>& v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(q * v.size()))];
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  cudaStream_t s;
  cudaStreamCreate(&s);
  CUfunction f;
  cudaGetFuncBySymbol(&f, (const void*)empty);
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPoint("cuLaunchKernel", &p, cudaEnableDefault, &q);
  auto launch = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**))p;
  std::vector<double> rt, drv;
  rt.reserve(n);
  drv.reserve(n);
  int arg = 0;
  void* args[] = {&arg};
  for (int i = 0; i < n + 1000; i++) {
    auto t0 = std::chrono::steady_clock::now();
    empty<<<1, 32, 0, s>>>(i);
    auto t1 = std::chrono::steady_clock::now();
    launch(f, 1, 1, 1, 32, 1, 1, 0, s, args, nullptr);
    auto t2 = std::chrono::steady_clock::now();
    if (i >= 1000) {  // warm-up first
      rt.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
      drv.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count());
    }
    if (i % 256 == 255) cudaStreamSynchronize(s);  // keep the queue short
  }
  cudaStreamSynchronize(s);
  printf("{\"launches\":%d,\"runtime_ns\":{\"p50\":%.0f,\"p99\":%.0f},\"driver_ns\":{\"p50\":%.0f,\"p99\":%.0f},\"error\":\"%s\"}\n",
         n, pct(rt, 0.5), pct(rt, 0.99), pct(drv, 0.5), pct(drv, 0.99),
         cudaGetErrorString(cudaGetLastError()));
  return 0;
}
