"""Can an offline stream wait on the GPU for a word in the gate's shared memory?

  python3 lab/scripts/gpu/gpu-wait-check.py OUT_DIR        (run alone, and under an MPS client)

The kernel scheduler holds offline launches on the CPU, so an offline kernel already queued
in its stream when an online request arrives still runs beside it. A stream memory
operation (`cuStreamWaitValue32`) placed before each offline kernel would make the GPU itself
hold queued kernels while a word says online work is in flight. This checks, on this GPU and
driver, the facts that design depends on, and prints them as JSON:

- a page of a MAP_SHARED file (/dev/shm and the OUT_DIR's file system) can be registered with
  `cuMemHostRegister(DEVICEMAP)` and waited on;
- what one wait costs a stream of short kernels (word in host memory, and in device memory);
- a queued kernel behind a wait does not run while the word is 1, and how soon it runs after
  the CPU writes 0 (from this process, and from another process that only maps the file).
Changes no GPU setting.
"""
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

import torch

EQ = 1  # CU_STREAM_WAIT_VALUE_EQ
DEVICEMAP = 2  # CU_MEMHOSTREGISTER_DEVICEMAP


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.cuda.init()
    x = torch.zeros(1 << 18, device="cuda")
    torch.cuda.synchronize()
    cu = ctypes.CDLL("libcuda.so.1")
    for f in ["cuMemHostRegister_v2", "cuMemHostGetDevicePointer_v2", "cuStreamWaitValue32_v2",
              "cuMemAlloc_v2", "cuMemsetD32_v2", "cuEventQuery", "cuMemHostUnregister"]:
        getattr(cu, f).restype = ctypes.c_int
    res = {"gpu": torch.cuda.get_device_name(), "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
           "torch": torch.__version__}
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def register(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 4096)
        m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        buf = (ctypes.c_char * 4096).from_buffer(m)
        addr = ctypes.addressof(buf)
        rc = cu.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(4096), DEVICEMAP)
        dptr = ctypes.c_uint64(0)
        rc2 = cu.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(addr), 0) if rc == 0 else None
        word = ctypes.c_uint32.from_address(addr)
        return {"register_rc": rc, "devptr_rc": rc2}, dptr.value, word, (m, buf, fd)

    keep = []
    regs = {}
    for name, path in [("dev_shm", f"/dev/shm/mmk-wait-check-{os.getpid()}"),
                       ("out_dir", f"{out}/wait-check-{os.getpid()}.page")]:
        info, dptr, word, k = register(path)
        keep.append(k)
        regs[name] = (info, dptr, word, path)
        res[f"register_{name}"] = info
    usable = [n for n, (i, d, _, _) in regs.items() if i["register_rc"] == 0 and i["devptr_rc"] == 0 and d]
    res["usable"] = usable
    if not usable:
        print(json.dumps(res, indent=1))
        json.dump(res, open(f"{out}/wait-check.json", "w"), indent=1)
        return
    _, host_dptr, word, path = regs[usable[0]]
    dev = ctypes.c_uint64(0)
    cu.cuMemAlloc_v2(ctypes.byref(dev), ctypes.c_size_t(4))
    cu.cuMemsetD32_v2(dev, 0, ctypes.c_size_t(1))
    word.value = 0

    def run(n, wait_ptr):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            if wait_ptr:
                rc = cu.cuStreamWaitValue32_v2(stream, ctypes.c_uint64(wait_ptr), 0, EQ)
                assert rc == 0, rc
            x.add_(1.0)
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) * 1000 / n  # us per kernel

    kernel_us = {"none": [], "host_word": [], "device_word": []}
    for _ in range(5):
        kernel_us["none"].append(run(2000, 0))
        kernel_us["host_word"].append(run(2000, host_dptr))
        kernel_us["device_word"].append(run(2000, dev.value))
    res["us_per_kernel_median_of_5"] = {k: round(statistics.median(v), 3) for k, v in kernel_us.items()}

    # Hold and release: a kernel behind a wait on a word that is 1.
    def held(writer):
        word.value = 1
        torch.cuda.synchronize()
        cu.cuStreamWaitValue32_v2(stream, ctypes.c_uint64(host_dptr), 0, EQ)
        x.add_(1.0)
        ev = torch.cuda.Event()
        ev.record()
        time.sleep(0.05)
        ran_while_held = ev.query()
        t0 = time.perf_counter_ns()
        writer()
        while not ev.query():
            pass
        return ran_while_held, (time.perf_counter_ns() - t0) / 1000

    lat = []
    ran = []
    for _ in range(50):
        r, us = held(lambda: setattr(word, "value", 0))
        ran.append(r)
        lat.append(us)
    res["held_ran_while_word_1"] = sum(ran)
    res["release_us_same_process"] = {"p50": round(statistics.median(lat), 1), "max": round(max(lat), 1)}
    # Another process writes the 0 (it maps the file; no CUDA there).
    lat = []
    ran = []
    for _ in range(10):
        r, us = held(lambda: subprocess.run([sys.executable, "-c",
                                             "import mmap,os,ctypes,sys;fd=os.open(sys.argv[1],os.O_RDWR);"
                                             "m=mmap.mmap(fd,4096);m[0:4]=bytes(4)", path], check=True))
        ran.append(r)
        lat.append(us)
    res["held_ran_while_word_1_other_process"] = sum(ran)
    res["release_us_other_process_incl_spawn"] = {"p50": round(statistics.median(lat), 1)}
    print(json.dumps(res, indent=1))
    json.dump(res, open(f"{out}/wait-check.json", "w"), indent=1)
    for _, _, _, p in regs.values():
        os.unlink(p)


if __name__ == "__main__":
    main()
