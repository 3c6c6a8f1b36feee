"""Issue 7's co-location benchmark with the jobs started by mmkd itself (docs/kernel-sched.md,
"Co-location", through mmkd).

The same two jobs as lab/scripts/gpu/ksched-colocate.py (lab/scripts/gpu/colocate.py: the
graph-replaying ResNet-50 service at batch 4 with Poisson arrivals, BERT-base training),
but submitted to `mmkd --backend nvml` as command jobs, so the environment, the MPS daemon,
the gate and the interposer are the ones mmkd gives a job. One fresh mmkd per run, with:

  ideal                        the service alone, started directly (no mmkd, no MPS)
  mps                          mmkd --mps nvidia --kernel-policy off: plain MPS, both jobs
                               at 100 % (first-fit), with mmkd's MPS client priorities
  mmkd-devwait-baseN           mmkd --mps nvidia, the mmk policy with the device wait
  mmkd-nomps-devwait-baseN     mmkd --mps off (the two contexts time-slice), the same
                               kernel scheduler

The kernel-scheduler runs also get --kernel-gemm-slice (8000 MFLOP by default), a gate
directory in /dev/shm and --kernel-base N us; both jobs carry the kernel profiles that
`mmk-lab profile` makes first. Rounds rotate the order as lab/scripts/gpu/ksched-rounds.sh does;
the result (OUT/rounds.json) has the shape of ksched-colocate.py's, for ksched-rounds.py.

Usage, on the GPU machine from the repo root:
  python3 lab/scripts/gpu/ksched-mmkd.py BIN_DIR OUT_DIR [--rounds R] [--seconds S] [--configs a,b]
BIN_DIR holds mmkd, mmkctl and libmmk_interposer.so (release builds). The MPS daemons are
mmkd's (quit when it stops); no GPU setting is changed.
"""
import argparse
import glob
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
from importlib import import_module

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
APP = os.path.join(HERE, "colocate.py")
pct = import_module("ksched-colocate").pct
CONFIG = re.compile(r"ideal|mps|mmkd(-nomps)?-devwait-base([0-9]+)")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def job_file(path, name, cls, memory, args, env, kernel_profile):
    # JSON strings are YAML scalars: paths and arguments need no quoting rules of their own.
    lines = [f"name: {name}", f"class: {cls}", f"gpu_memory: {memory}", "command:",
             f"  args: {json.dumps(args)}"]
    if env:
        lines += ["  env:"] + [f"    {k}: {json.dumps(v)}" for k, v in env.items()]
    if kernel_profile:
        lines.append(f"  kernel_profile: {json.dumps(kernel_profile)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


class Mmkd:
    """One mmkd on the real GPU, in a data directory of its own."""

    def __init__(self, bin_dir, work, flags, env, log_path=None):
        self.sock = f"{work}/mmkd.sock"
        self.ctl_bin = f"{bin_dir}/mmkctl"
        self.env = env
        self.log_path = log_path or f"{work}/mmkd.log"
        self.log = open(self.log_path, "w")
        cmd = [f"{bin_dir}/mmkd", "--backend", "nvml", "--data-dir", f"{work}/data", "--socket",
               self.sock] + flags
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        end = time.time() + 60
        while subprocess.run([self.ctl_bin, "--socket", self.sock, "gpus"],
                             capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.time() > end:
                self.stop()
                raise RuntimeError(f"mmkd did not come up: {open(self.log_path).read()[-2000:]}")
            time.sleep(0.2)

    def ctl(self, *args):
        r = subprocess.run([self.ctl_bin, "--socket", self.sock, "--output", "json", *args],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mmkctl {' '.join(args)}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def wait_state(self, job, states, timeout):
        end = time.time() + timeout
        while time.time() < end:
            j = self.ctl("jobs", "get", str(job))
            if j["state"] in states:
                return j
            if j["state"] in ("FAILED", "CANCELLED", "SUCCEEDED"):
                raise RuntimeError(f"job {job} {j['state']}: {j['reason']}\n{stderr_tail(j)}")
            time.sleep(0.2)
        raise RuntimeError(f"job {job} not {states} within {timeout} s")

    def wait_log(self, job, needle, timeout):
        """Until the job's stderr has `needle`; a job that ends first is an error with its reason."""
        end = time.time() + timeout
        while time.time() < end:
            j = self.ctl("jobs", "get", str(job))
            if needle in stderr_tail(j, None):
                return
            if j["state"] != "RUNNING":
                raise RuntimeError(f"job {job} {j['state']} before {needle!r}: {j['reason']}\n{stderr_tail(j)}")
            time.sleep(0.2)
        raise RuntimeError(f"no {needle!r} on job {job}'s stderr within {timeout} s")

    def stop(self):
        """SIGTERM (mmkd stops its jobs, then quits its MPS daemons); SIGKILL after 60 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def stderr_tail(job, n=2000):
    """The end of a job's stderr.log ("" when it has none yet)."""
    try:
        text = open(os.path.join(job["log_dir"], "stderr.log")).read()
    except (OSError, KeyError, TypeError):
        return ""
    return text if n is None else text[-n:]


def run(cmd, env, what):
    """Runs cmd; a failure stops the script with what cmd wrote on stderr."""
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        log(r.stderr[-3000:])
        raise RuntimeError(f"{what} exited {r.returncode}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("out")
    ap.add_argument("--configs", default="ideal,mps,mmkd-devwait-base1500,mmkd-nomps-devwait-base3000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--gemm-slice", type=int, default=8000)
    ap.add_argument("--profile-seconds", type=float, default=4.0)
    a = ap.parse_args()
    bin_dir, out = os.path.abspath(a.bin), os.path.abspath(a.out)
    listed = a.configs.split(",")
    for c in listed:
        m = CONFIG.fullmatch(c)
        if not m or (m.group(2) and int(m.group(2)) == 0):
            raise SystemExit(f"{c}: not a configuration (ideal, mps, mmkd-devwait-baseN, "
                             "mmkd-nomps-devwait-baseN, with N > 0 us)")
    if len(set(listed)) != len(listed):
        raise SystemExit(f"--configs {a.configs}: a configuration is listed twice (rounds repeat them)")
    if a.rounds < 1:
        raise SystemExit("--rounds needs at least 1")
    for f in ["mmkd", "mmkctl", "libmmk_interposer.so"]:
        if not os.path.exists(f"{bin_dir}/{f}"):
            raise SystemExit(f"{bin_dir}: no {f} there")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mmk-ksched-mmkd-")
    gate_dir = tempfile.mkdtemp(prefix="mmk-ksched-mmkd-", dir="/dev/shm")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MMK_", "CUDA_MPS_"))} | {"PYTHONUNBUFFERED": "1"}
    serve = [sys.executable, APP, "serve", "--batch", "4", "--interval-ms", "20", "--stream",
             "side", "--graph"]
    results = {"configs": {}, "setup": vars(a), "gpu": subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip()}
    try:
        # Kernel profiles of each job alone, as ksched-colocate.py makes them.
        profiles = {}
        for name, cls, args in [
            ("serve", "online", serve + ["--seconds", str(a.profile_seconds), "--out", f"{work}/p.json"]),
            ("train", "offline", [sys.executable, APP, "train", "--seconds", str(a.profile_seconds),
                                  "--out", f"{work}/p.json"]),
        ]:
            y = f"{work}/p-{name}.yaml"
            job_file(y, name, cls, "8GiB", args, {}, None)
            profiles[name] = f"{out}/{name}.kprofile.json"
            run([f"{bin_dir}/mmk-lab", "profile", y, "--interposer",
                 f"{bin_dir}/libmmk_interposer.so", "-o", profiles[name]], env, f"mmk-lab profile {name}")
            log(f"profile {name}: done")
        runs = []
        for r in range(1, a.rounds + 1):
            for i in range(len(listed)):
                c = listed[(i + r - 1) % len(listed)]
                runs.append((c, c if r == 1 else f"{c}@{r}"))
        for c, name in runs:
            results["configs"][name] = run_one(a, c, name, bin_dir, out, work, gate_dir, env,
                                               serve, profiles)
            log(f"{name}: " + json.dumps({k: v for k, v in results["configs"][name].items()
                                          if k not in ("latencies_ms",) and not k.endswith("_stats")}))
            json.dump(results, open(f"{out}/rounds.json", "w"), indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(gate_dir, ignore_errors=True)


def run_one(a, c, name, bin_dir, out, work, gate_dir, env, serve, profiles):
    t = time.time()
    d = f"{work}/{name}"
    os.makedirs(d)
    serve_out, train_out = f"{d}/serve.json", f"{d}/train.json"
    serve_args = serve + ["--seconds", str(a.seconds), "--out", serve_out]
    r = {}
    if c == "ideal":
        run(serve_args, env, f"{name}: the service")
    else:
        m = CONFIG.fullmatch(c)
        flags = ["--mps", "off" if m.group(1) else "nvidia"]
        if c == "mps":
            flags += ["--kernel-policy", "off"]
        else:
            flags += ["--kernel-policy", "mmk", "--kernel-device-wait", "--kernel-gate-dir",
                      gate_dir, "--kernel-gemm-slice", str(a.gemm_slice), "--kernel-base",
                      f"{m.group(2)}us"]
        flags += ["--planner", "first-fit", "--interposer", f"{bin_dir}/libmmk_interposer.so"]
        mmkd = Mmkd(bin_dir, d, flags, env)
        try:
            kernel = c != "mps"
            jobs = {}
            for cls, prof, args, memory in [
                ("offline", "train", [sys.executable, APP, "train", "--seconds", "600", "--out", train_out], "24GiB"),
                ("online", "serve", serve_args, "16GiB"),
            ]:
                y = f"{d}/{prof}.yaml"
                job_file(y, prof, cls, memory, args, {"PYTHONUNBUFFERED": "1"},
                         profiles[prof] if kernel else None)
                j = mmkd.ctl("submit", y)
                jobs[cls] = mmkd.wait_state(j["id"], ["RUNNING"], 60)
                if cls == "offline":
                    mmkd.wait_log(j["id"], "train: warm", 180)
            r["assignment"] = {cls: j["assignment"] for cls, j in jobs.items()}
            if len({a["device_uuid"] for a in r["assignment"].values()}) != 1:
                raise RuntimeError(f"{name}: the jobs are not in one partition: {r['assignment']}")
            done = mmkd.wait_state(jobs["online"]["id"], ["SUCCEEDED"], 300)
            r["online_end"] = done["reason"]
            # SIGTERM: the training writes its step times and exits (colocate.py).
            mmkd.ctl("jobs", "cancel", str(jobs["offline"]["id"]), "--reason", "run over")
        finally:
            mmkd.stop()
        # mmkd has each scheduled process write its interposer stats beside the job's logs
        # (at a normal exit: both jobs end on their own or on SIGTERM, which they handle).
        for cls, j in jobs.items():
            dest = f"{out}/{name}.{cls}.stats.json"
            if os.path.exists(dest):
                os.unlink(dest)
            found = glob.glob(os.path.join(j["log_dir"], "ksched-*.json"))
            if kernel and len(found) != 1:
                raise RuntimeError(f"{name}: {cls} job left {len(found)} stats files, not one: {found}")
            if found:
                shutil.copy(found[0], dest)
    s = json.load(open(serve_out))
    lat = [x * 1e3 for x in s["latencies_s"]]
    r.update(requests=len(lat), p50_ms=pct(lat, 50), p99_ms=pct(lat, 99), mean_ms=statistics.fmean(lat),
             window_s=s["t1"] - s["t0"], stream_priority=s.get("stream_priority"),
             latencies_ms=[round(x, 3) for x in lat])
    if c != "ideal":
        if not os.path.exists(train_out):
            raise RuntimeError(f"{name}: the training wrote no {train_out} (killed before its clean exit?)")
        ends = json.load(open(train_out))["step_ends_s"]
        r["train_steps_per_s"] = sum(1 for e in ends if s["t0"] <= e <= s["t1"]) / (s["t1"] - s["t0"])
    for cls in ["online", "offline"]:
        p = f"{out}/{name}.{cls}.stats.json"
        if os.path.exists(p):
            r[f"{cls}_stats"] = json.load(open(p))
    r["wall_s"] = time.time() - t
    return r


if __name__ == "__main__":
    main()
