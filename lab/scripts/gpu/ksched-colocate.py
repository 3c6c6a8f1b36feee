"""The co-location benchmark of issue 7 (docs/kernel-sched.md, "Co-location").

An online ResNet-50 service (Poisson arrivals) next to offline BERT training on one GPU,
MIG off, under: the service alone (ideal), time-slicing (no MPS), plain MPS, MPS with
shares, and MPS with shares plus the kernel scheduler under each policy (ks-), the kernel
scheduler on plain MPS (ksfull-) or without MPS (tsks-); names and suffixes below. The kernel
profiles come from `mmk-lab profile` (each job alone, record mode); the raw traces are kept
for `mmk-lab ksim`.

Usage, on the GPU machine from the repo root:
  python3 lab/scripts/gpu/ksched-colocate.py BIN_DIR OUT_DIR [--configs a,b,...] [--seconds S]
BIN_DIR holds libmmk_interposer.so, mmk-gate and mmkctl (release builds).

Starts one MPS control daemon with private pipe and log directories and quits it at the
end; changes no other GPU setting.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "colocate.py")

NO_MPS = ["ideal", "train-alone", "timeslice"]
MPS = ["mps", "mps-shares", "ks-passthrough", "ks-mmk", "ks-orion", "ks-fikit"]
# ksfull-POLICY: the kernel scheduler on plain MPS (both jobs at 100 %).
# tsks-POLICY: the kernel scheduler without MPS (time-slicing between the two processes'
# contexts); the gate and the device wait work the same, stream priority acts only within
# the service's own context, and "-cprio" and "-offshareN" (MPS settings) do not apply.
# A configuration may be repeated with a tag: "mps@2" runs "mps" again under its own name.
# A suffix "-cprio" on an MPS configuration gives the clients mmkd's CUDA_MPS_CLIENT_PRIORITY
# (online 0, offline 1, below normal). With the interposer loaded, the online job's streams
# get the greatest priority (its default; "-keepprio" turns that off); with
# `--serve-stream side` the service runs on a stream of its own, which that reaches.
# Suffixes "-baseN" and "-depthN" (N > 0, after every other suffix and before any "@R", in
# any order) on a kernel-scheduler configuration create its gate with `--base-us N` (the
# anti-starvation base) instead of 2.5 % of the service's profiled request latency, and with
# `--offline-depth N` (mmk: at most N offline kernels in flight while the service is
# present) instead of no cap. A suffix "-alt" there runs that configuration with the
# interposer and mmk-gate of `--alt-bin DIR` instead of BIN_DIR's (another build, for an
# A/B of two builds in one call; the profiles are always made with BIN_DIR's). A suffix
# "-sliceN" creates the gate with `--gemm-slice-mflop N`: the training job's cuBLAS GEMMs
# over N MFLOP are cut into pieces of at most N (kernel-sched/src/slice.rs). A suffix
# "-devwait" creates the gate in /dev/shm with `--device-wait on`: the training job's
# launches also wait on the GPU while the service has work in flight
# (kernel-sched/interposer/src/device.rs); with "-grainN" as well, only once N us of the
# training's expected work (from its profile) have been launched since the last wait
# (`--device-wait-grain-us N`). A suffix "-notrain" runs the service alone under that
# configuration (MPS, interposer, gate): the floor the scheduler can reach. It also goes on
# "mps" and "mps-cprio" (the service alone as an MPS client, no interposer), which splits
# that floor into MPS's part and the interposer's. A suffix "-offshareN" on "mps",
# "mps-cprio" or a "ksfull-" configuration gives the training job an MPS active thread
# percentage of N (the service keeps 100 %): SMs the training can never fill are left for
# the service. A suffix "-trainspinN" or "-traincopyN" (N us), with "sync" after it or not
# ("-trainspin10sync"), replaces the BERT training with colocate.py's synthetic offline job
# (`train --kind spin|copy --kernel-us N [--sync-each]`): kernels of a known length, with
# no memory traffic (spin) or streaming HBM (copy), to split what the service still loses
# into the kernel in flight, the context switch and the cache; "-trainidle" runs one that
# makes its context and then only sleeps (`--kind idle`). Its kernel profile is made like
# the BERT job's; its training figure is against "mps" with the same suffix, if run.


# A synthetic training's suffix: "-trainidle", or kind (spin, copy), N us and "sync" or not.
TRAIN = r"-train(?:(?P<idle>idle)|(?P<kind>spin|copy)(?P<us>[0-9]+)(?P<sync>sync)?)"


def train_suffix(c):
    """The "-train..." suffix of a configuration name ("" for the BERT training)."""
    m = re.search(TRAIN + r"(?=-|@|$)", c)
    return m.group(0) if m else ""


def train_args(kind):
    """colocate.py's train arguments for a "-train..." suffix (kind "" is BERT)."""
    if not kind:
        return []
    m = re.fullmatch(TRAIN, kind)
    if m["idle"]:
        return ["--kind", "idle"]
    return ["--kind", m["kind"], "--kernel-us", m["us"]] + (["--sync-each"] if m["sync"] else [])


def parse_config(c, alt_bin=None):
    """(configuration, -cprio, -keepprio, -baseN or None, -depthN or 0, -alt, -sliceN or 0,
    -devwait, -grainN or 0, -notrain, -offshareN or 0) of a name; a bad name stops the script before anything runs."""
    base_c, cprio, keepprio = c.split("@")[0], False, False
    base_us, depth, slice_mflop, grain, offshare, given = None, 0, 0, 0, 0, set()
    while True:
        if t := re.fullmatch(r"(?P<rest>.*)" + TRAIN, base_c):
            if "train" in given or (t["us"] is not None and int(t["us"]) <= 0):
                raise SystemExit(f"{c}: -trainidle, -trainspinN or -traincopyN once, with N > 0")
            base_c = t["rest"]
            given.add("train")
            continue
        m = re.fullmatch(r"(.*)-(base|depth|slice|grain|offshare)([0-9]+)|(.*)-(alt|devwait|notrain)", base_c)
        if not m:
            break
        if m.group(5):
            base_c, key, n = m.group(4), m.group(5), 1
        else:
            base_c, key, n = m.group(1), m.group(2), int(m.group(3))
        if n <= 0 or key in given:
            raise SystemExit(f"{c}: -{key}N needs N > 0, once" if key not in ("alt", "devwait", "notrain")
                             else f"{c}: -{key} once")
        given.add(key)
        if key == "base":
            base_us = n
        elif key == "depth":
            depth = n
        elif key == "slice":
            slice_mflop = n
        elif key == "grain":
            grain = n
        elif key == "offshare":
            offshare = n
    if "grain" in given and "devwait" not in given:
        raise SystemExit(f"{c}: -grainN needs -devwait")
    if any(f"-{k}" in base_c for k in ["base", "depth", "slice", "grain", "offshare", "alt", "devwait", "notrain",
                                        "train"]):
        raise SystemExit(f"{c}: -baseN, -depthN, -sliceN, -grainN, -offshareN, -alt, -devwait, -notrain and "
                         "-train... must end the name, with N > 0")
    if "train" in given and ("notrain" in given or base_c == "ideal"):
        raise SystemExit(f"{c}: -train... picks the training job, which "
                         f"{'-notrain' if 'notrain' in given else 'ideal'} leaves out")
    if given - {"notrain", "offshare", "train"} and not re.match(r"(ks|ksfull|tsks)-", base_c):
        raise SystemExit(f"{c}: these suffixes need a kernel-scheduler "
                         "configuration")
    if "notrain" in given and not re.match(r"(ks|ksfull|tsks)-|mps(-cprio)?$", base_c):
        raise SystemExit(f"{c}: -notrain needs mps, mps-cprio or a kernel-scheduler configuration")
    if "offshare" in given and not re.match(r"ksfull-|mps(-cprio)?$", base_c):
        raise SystemExit(f"{c}: -offshareN needs plain MPS (mps, mps-cprio or ksfull-...)")
    if given >= {"notrain", "offshare"}:
        raise SystemExit(f"{c}: -offshareN caps the training, which -notrain leaves out")
    if offshare > 100:
        raise SystemExit(f"{c}: -offshareN needs N <= 100")
    if "alt" in given and not alt_bin:
        raise SystemExit(f"{c}: -alt needs --alt-bin")
    for suffix in ["-cprio", "-keepprio"]:
        if base_c.endswith(suffix):
            base_c = base_c[: -len(suffix)]
            cprio |= suffix == "-cprio"
            keepprio |= suffix == "-keepprio"
    if base_c.startswith("tsks-") and cprio:
        raise SystemExit(f"{c}: -cprio is an MPS client priority; tsks- runs without MPS")
    if depth and not base_c.endswith("-mmk"):
        raise SystemExit(f"{c}: -depthN acts only under the mmk policy")
    return (base_c, cprio, keepprio, base_us, depth, "alt" in given, slice_mflop, "devwait" in given, grain,
            "notrain" in given, offshare)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def job_yaml(path, name, cls, args):
    with open(path, "w") as f:
        f.write(f"name: {name}\nclass: {cls}\ngpu_memory: 8GiB\ncommand:\n  args: {json.dumps(args)}\n")


def wait_line(proc, needle, timeout):
    end = time.time() + timeout
    while time.time() < end:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                raise RuntimeError(f"process exited ({proc.returncode}) before {needle!r}")
            continue
        if needle in line:
            return
    raise RuntimeError(f"no {needle!r} within {timeout} s")


def drain(proc):
    # Keep the pipe from filling up; the lines are not needed.
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("out")
    ap.add_argument("--configs", default=",".join(NO_MPS + MPS))
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--interval-ms", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--online-share", type=int, default=60)
    ap.add_argument("--offline-share", type=int, default=40)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--profile-seconds", type=float, default=4.0)
    ap.add_argument("--serve-stream", choices=["default", "side"], default="default")
    ap.add_argument("--alt-bin", help="another build's interposer and mmk-gate, for -alt")
    ap.add_argument("--serve-graph", action="store_true",
                    help="the service replays its forward pass as one CUDA graph")
    ap.add_argument("--serve-gpu-time", action="store_true",
                    help="the service times each request's GPU work with CUDA events")
    a = ap.parse_args()
    bin_dir = os.path.abspath(a.bin)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    so = os.path.join(bin_dir, "libmmk_interposer.so")
    work = tempfile.mkdtemp(prefix="mmk-colocate-")
    configs = a.configs.split(",")
    alt_bin = os.path.abspath(a.alt_bin) if a.alt_bin else None
    for f in ["libmmk_interposer.so", "mmk-gate"] if alt_bin else []:
        if not os.path.exists(f"{alt_bin}/{f}"):
            raise SystemExit(f"--alt-bin {alt_bin}: no {f} there")
    for c in configs:
        parse_config(c, alt_bin)
    results = {"configs": {}, "setup": vars(a)}
    results["gpu"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip()
    serve_args = ["python3", APP, "serve", "--batch", str(a.batch), "--interval-ms",
                  str(a.interval_ms), "--stream", a.serve_stream]
    if a.serve_graph:
        serve_args.append("--graph")
    if a.serve_gpu_time:
        serve_args.append("--gpu-time")
    serve_args += ["--seconds", str(a.seconds)]
    base = dict(os.environ, PYTHONUNBUFFERED="1")
    for k in list(base):
        if k.startswith("MMK_") or k.startswith("CUDA_MPS_"):
            del base[k]

    # 1. Kernel profiles of each job alone (record mode, no MPS), through mmk-lab profile.
    profiles = {}
    ks_configs = [c for c in configs if c.startswith(("ks", "tsks"))]
    to_profile = [("serve", "online", serve_args[:-1] + [str(a.profile_seconds), "--out", f"{work}/p-serve.json"])]
    # One profile per training job the kernel-scheduler configurations run (BERT: "train").
    for kind in sorted({train_suffix(c) for c in ks_configs}):
        to_profile.append((f"train{kind}", "offline", ["python3", APP, "train", "--seconds", str(a.profile_seconds),
                                                       "--out", f"{work}/p-train{kind}.json"] + train_args(kind)))
    for name, cls, args in to_profile:
        if not ks_configs:
            break
        y = f"{work}/{name}.yaml"
        job_yaml(y, name, cls, args)
        t = time.time()
        r = subprocess.run([f"{bin_dir}/mmk-lab", "--output", "json", "profile", y,
                            "--interposer", so, "-o", f"{out}/{name}.kprofile.json",
                            "--save-trace", f"{out}/{name}.trace.csv"],
                           env=base, capture_output=True, text=True)
        if r.returncode != 0:
            log(r.stderr[-3000:])
            raise SystemExit(f"mmk-lab profile {name} failed")
        profiles[name] = json.loads(r.stdout)
        subprocess.run(["gzip", "-f", "-9", f"{out}/{name}.trace.csv"], check=True)
        log(f"profile {name}: {time.time() - t:.0f} s, {profiles[name]['launches']} launches, "
            f"request {profiles[name]['request_us']:.0f} us")
    results["profiles"] = profiles
    dur_us = None
    if "serve" in profiles and profiles["serve"]["dur_threshold_us"]:
        dur_us = max(1, round(profiles["serve"]["dur_threshold_us"]))

    mps_dir = f"{work}/mps"
    mps_env = dict(base, CUDA_MPS_PIPE_DIRECTORY=f"{mps_dir}/pipe",
                   CUDA_MPS_LOG_DIRECTORY=f"{mps_dir}/log")
    mps_on = False

    def mps_start():
        os.makedirs(f"{mps_dir}/pipe", exist_ok=True)
        os.makedirs(f"{mps_dir}/log", exist_ok=True)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps_env, check=True)
        time.sleep(1)

    def mps_quit():
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=mps_env)
        time.sleep(2)

    gates = []
    try:
        for c in configs:
            (base_c, cprio, keepprio, base_us, depth, alt, slice_mflop, devwait, grain, notrain,
             offshare) = parse_config(c, alt_bin)
            c_bin = alt_bin if alt else bin_dir
            base_us = base_us or dur_us
            uses_mps = base_c in MPS or base_c.startswith("ksfull-")
            if uses_mps and not mps_on:
                mps_start()
                mps_on = True
            env = mps_env if uses_mps else base
            on_env, off_env = dict(env), dict(env)
            if base_c != "mps" and not base_c.startswith("ksfull-") and uses_mps:
                on_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(a.online_share)
                off_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(a.offline_share)
            if offshare:
                off_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(offshare)
            if cprio:
                on_env["CUDA_MPS_CLIENT_PRIORITY"] = "0"
                off_env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
            if keepprio:
                on_env["MMK_KSCHED_STREAM_PRIORITY"] = "keep"
            if base_c.startswith(("ks-", "ksfull-", "tsks-")):
                policy = base_c.split("-", 1)[1]
                # The driver maps a gate page for the GPU only from a memory file system.
                gate = f"/dev/shm/mmk-colocate-{os.getpid()}-{policy}.gate" if devwait else f"{work}/{policy}.gate"
                gates.append(gate)
                # A fresh gate per run: one left by an earlier configuration would be taken over.
                if os.path.exists(gate):
                    os.unlink(gate)
                cmd = [f"{c_bin}/mmk-gate", "create", gate, "--sms", str(a.sms), "--policy", policy]
                if base_us:
                    cmd += ["--base-us", str(base_us)]
                if depth:
                    cmd += ["--offline-depth", str(depth)]
                if slice_mflop:
                    cmd += ["--gemm-slice-mflop", str(slice_mflop)]
                if devwait:
                    cmd += ["--device-wait", "on", "--device-wait-grain-us", str(grain)]
                subprocess.run(cmd, check=True, capture_output=True)
                for e, cls, prof in [(on_env, "online", "serve"), (off_env, "offline", f"train{train_suffix(c)}")]:
                    e.update(LD_PRELOAD=f"{c_bin}/libmmk_interposer.so", MMK_GATE=gate, MMK_JOB_CLASS=cls,
                             MMK_KSCHED_STATS=f"{out}/{c}.{cls}.stats.json")
                    if os.path.exists(f"{out}/{prof}.kprofile.json"):
                        e["MMK_KSCHED_PROFILE"] = f"{out}/{prof}.kprofile.json"
            t = time.time()
            r = {}
            train = None
            if base_c != "ideal" and not notrain:
                secs = a.seconds if base_c == "train-alone" else 600
                train = subprocess.Popen(["python3", APP, "train", "--seconds", str(secs),
                                          "--out", f"{work}/{c}.train.json"] + train_args(train_suffix(c)),
                                         env=off_env, stderr=subprocess.PIPE, text=True)
                wait_line(train, "train: warm", 180)
                drain(train)
            if base_c != "train-alone":
                serve = subprocess.Popen(serve_args + ["--out", f"{work}/{c}.serve.json"],
                                         env=on_env, stderr=subprocess.PIPE, text=True)
                drain(serve)
                serve.wait(timeout=300)
                if serve.returncode != 0:
                    raise RuntimeError(f"{c}: serve exited {serve.returncode}")
                s = json.load(open(f"{work}/{c}.serve.json"))
                lat = [x * 1e3 for x in s["latencies_s"]]
                r.update(requests=len(lat), p50_ms=pct(lat, 50), p99_ms=pct(lat, 99),
                         mean_ms=statistics.fmean(lat), window_s=s["t1"] - s["t0"],
                         stream_priority=s.get("stream_priority"),
                         latencies_ms=[round(x, 3) for x in lat])
                if "gpu_s" in s:
                    gpu = [x * 1e3 for x in s["gpu_s"]]
                    wait = [x - g for x, g in zip(lat, gpu)]
                    r.update(gpu_p50_ms=pct(gpu, 50), gpu_p99_ms=pct(gpu, 99), wait_p50_ms=pct(wait, 50),
                             wait_p99_ms=pct(wait, 99), gpu_ms=[round(x, 3) for x in gpu])
                window = (s["t0"], s["t1"])
                r["window_unix_s"] = [s.get("t0_unix"), s.get("t1_unix")]
            if train is not None:
                if base_c != "train-alone":
                    train.send_signal(signal.SIGINT)
                train.wait(timeout=120)
                tj = json.load(open(f"{work}/{c}.train.json"))
                ends = tj["step_ends_s"]
                if "kind" in tj:
                    r["train_kind"] = {k: tj[k] for k in ["kind", "kernel_us", "kernels_per_step", "sync_each"]}
                if base_c == "train-alone":
                    window = (ends[0], ends[-1])
                    n = len(ends) - 1
                else:
                    n = sum(1 for e in ends if window[0] <= e <= window[1])
                r["train_steps_per_s"] = n / (window[1] - window[0])
            for cls in ["online", "offline"]:
                p = f"{out}/{c}.{cls}.stats.json"
                if os.path.exists(p):
                    r[f"{cls}_stats"] = json.load(open(p))
            r["started_unix_s"], r["wall_s"] = t, time.time() - t
            if offshare:
                r["offline_share"] = offshare
            if base_c.startswith(("ks", "tsks")):
                r["base_us"] = base_us
                r["offline_depth"] = depth
                r["device_wait"] = devwait
                r["device_wait_grain_us"] = grain
                r["bin"] = c_bin
            results["configs"][c] = r
            log(f"{c}: " + json.dumps({k: v for k, v in r.items()
                                       if not k.endswith("_stats") and k not in ("latencies_ms", "gpu_ms")}))
            json.dump(results, open(f"{out}/colocate.json", "w"), indent=1)
    finally:
        if mps_on:
            mps_quit()
        shutil.rmtree(work, ignore_errors=True)
        for g in gates:
            if g.startswith("/dev/shm/") and os.path.exists(g):
                os.unlink(g)
    json.dump(results, open(f"{out}/colocate.json", "w"), indent=1)
    # One archive of everything, for machines that send back only a few files.
    names = sorted(n for n in os.listdir(out) if n != "all.tar.gz")
    subprocess.run(["tar", "czf", f"{out}/all.tar.gz", "-C", out] + names, check=True)


if __name__ == "__main__":
    main()
