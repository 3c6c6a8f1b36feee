"""The default path of a real user, measured: a training and an inference service started
with `mmkctl run` and no profile against `mmkd --backend nvml` with every other setting at
its default (planner MMK, the built-in forest, real MPS, the kernel scheduler next to
mmkd), beside the same two jobs under plain MPS and each alone, in one call.

The jobs are lab/scripts/gpu/colocate.py's: BERT-base training (offline) and the ResNet-50
service at batch 4 with Poisson arrivals (online). The training starts first; once it is
warm the service asks, and the time until its process runs is recorded.

  ideal        the service alone, started directly (no mmkd, no MPS)
  train-alone  the training alone, started directly
  mps          plain MPS: mmkd --planner first-fit --kernel-policy off (both jobs at 100 %)
  default      mmkd --backend nvml, nothing else
  learned      the same, the pair run twice on one mmkd: the first run is planned on the
               prior and learned, the second on the learned profiles (`mmkctl profiles`)
  default-ksoff  the same with --kernel-policy off: MMK's shares without the kernel gate
  default-budgetN  the same with --kernel-hold-budget N (100: no budget, Listing 1 as the
               paper has it; 0: the gate tracks every launch but never holds one)
  default-policy-P  the same with --kernel-policy P
  mps-policy-P  plain MPS's planner (both jobs at 100 %) with the kernel scheduler's policy P
               (passthrough: the interposer in both jobs, online streams at the greatest
               priority, nothing tracked or held)
  ideal-interposer  the service alone with the interposer preloaded and no gate
  CONFIG-pollN   CONFIG with MMK_KSCHED_POLL_US=N for mmkd and the jobs
  CONFIG-altso  CONFIG with BIN_DIR/alt/libmmk_interposer.so as the interposer (another
                 build's, to compare two builds of it in one call)
  CONFIG-hooksonly  CONFIG with MMK_KSCHED_OFF=1 for mmkd and the jobs: the interposer is
                 preloaded but passes every call straight through (no gate, no count)
  CONFIG-offmaxN  CONFIG with --offline-share-max N (an offline job's MPS share at most N %)
  CONFIG-perlaunch  CONFIG with MMK_KSCHED_EVENTS=launch (each launch records its own
                 tracking event, on the launching thread)
  default-tuned  the same with the gate settings of the best measured co-location
               (--kernel-device-wait, --kernel-offline-depth 8, --kernel-base 1500us,
               --kernel-gemm-slice 8000, the gates in /dev/shm)

Usage, on the GPU machine from the repo root:
  python3 lab/scripts/gpu/default-path.py BIN_DIR OUT_DIR [--seconds S] [--interval-ms MS]
BIN_DIR holds mmkd, mmkctl and libmmk_interposer.so (release builds). Writes
OUT/default-path.json and OUT/mmkd-*.log; no GPU setting is changed.
"""
import argparse
import json
import os
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


def log(*a):
    print(*a, file=sys.stderr, flush=True)


pct = import_module("ksched-colocate").pct


class Mmkd(import_module("ksched-mmkd").Mmkd):
    """ksched-mmkd.py's mmkd on the real GPU, with what `mmkctl run` needs."""

    def run(self, cls, memory, name, args):
        """`mmkctl run` in the background, as a user starts a job."""
        err = open(f"{os.path.dirname(self.log_path)}/{name}.err", "w")
        return subprocess.Popen([self.ctl_bin, "--socket", self.sock, "run", f"--{cls}",
                                 "--memory", memory, "--name", name, "--", *args],
                                env=self.env, stdout=subprocess.DEVNULL, stderr=err)

    after = 0  # jobs up to this id belong to an earlier pair

    def job(self, name):
        """This pair's job of that name."""
        named = [j for j in self.ctl("jobs") if j["name"] == name and j["id"] > self.after]
        return max(named, key=lambda j: j["id"]) if named else None

    def wait_running(self, name, timeout):
        end = time.time() + timeout
        while time.time() < end:
            j = self.job(name)
            if j and j["state"] == "RUNNING":
                return j
            if j and j["state"] in ("FAILED", "CANCELLED", "SUCCEEDED"):
                raise RuntimeError(f"{name} {j['state']}: {j['reason']}")
            time.sleep(0.05)
        raise RuntimeError(f"{name} not RUNNING within {timeout} s: {self.job(name)}")


def wait_file_line(path, needle, timeout):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if needle in open(path).read():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no {needle!r} in {path} within {timeout} s")


def serve_result(path):
    s = json.load(open(path))
    lat = [x * 1e3 for x in s["latencies_s"]]
    return s, {"requests": len(lat), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
               "mean_ms": statistics.fmean(lat),
               "latencies_ms": [round(x, 3) for x in lat]}


def brief(r):
    """A result without its latencies, for the log."""
    if isinstance(r, dict):
        return {k: brief(v) for k, v in r.items() if k != "latencies_ms"}
    return r


def summarize(runs):
    """Per configuration over its rounds: the service's latencies pooled (p50, p99), each
    round's p99, and the training's steps/s (mean, and against plain MPS's mean)."""
    by = {}
    for name, r in runs.items():
        for part, x in ([("first", r["first"]), ("second", r["second"])] if "first" in r
                        else [("", r)]):
            key = name.split("@")[0] + (f":{part}" if part else "")
            by.setdefault(key, []).append(x)
    out = {}
    for key, xs in by.items():
        lat = [v for x in xs for v in x.get("latencies_ms", [])]
        steps = [x["train_steps_per_s"] for x in xs if x.get("train_steps_per_s")]
        out[key] = {
            "rounds": len(xs),
            "p50_ms": pct(lat, 50) if lat else None,
            "p99_ms": pct(lat, 99) if lat else None,
            "p99_by_round_ms": [round(x["p99_ms"], 1) for x in xs if "p99_ms" in x],
            "train_steps_per_s": statistics.fmean(steps) if steps else None,
        }
    mps = (out.get("mps") or {}).get("train_steps_per_s")
    for v in out.values():
        if mps and v["train_steps_per_s"]:
            v["train_vs_mps"] = v["train_steps_per_s"] / mps
    return out


def steps_per_s(path, t0, t1):
    ends = json.load(open(path))["step_ends_s"]
    return sum(1 for e in ends if t0 <= e <= t1) / (t1 - t0)


def pair(m, d, out, serve, seconds):
    """The training, then the service beside it once the training is warm, both through
    `mmkctl run` on mmkd `m`; the service's latencies and the training's steps meanwhile."""
    so, to = f"{d}/serve.json", f"{d}/train.json"
    r, procs = {}, []
    m.after = max([j["id"] for j in m.ctl("jobs")], default=0)
    try:
        procs.append(m.run("offline", "24G", "train",
                           [sys.executable, APP, "train", "--seconds", "600", "--out", to]))
        m.wait_running("train", 120)
        # mmkctl run's command writes to mmkctl's stderr.
        wait_file_line(f"{out}/train.err", "train: warm", 240)
        asked = time.time()
        procs.append(m.run("online", "16G", "serve", serve + ["--seconds", str(seconds), "--out", so]))
        sj = m.wait_running("serve", 120)
        r["online_start_s"] = round(time.time() - asked, 3)
        tj = m.job("train")
        r["assignment"] = {"online": sj["assignment"], "offline": tj["assignment"]}
        r["planned_as"] = {"online": sj.get("planner_profile"),
                           "offline": tj.get("planner_profile")}
        procs[1].wait(timeout=seconds + 300)
        # What the kernel gates counted meanwhile (launches, holds, forced launches).
        try:
            r["gates"] = [{k: s.get(k) for k in ("class", "launches", "held", "held_us",
                                                  "forced", "max_held_us")}
                          for g in m.ctl("partitions", "show")
                          for p in g.get("partitions", [])
                          for s in ((p.get("gate") or {}).get("processes") or [])]
        except (RuntimeError, ValueError, AttributeError, TypeError) as e:
            r["gates"] = str(e)
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(timeout=120)
        r["reasons"] = {n: (m.job(n) or {}).get("reason") for n in ("train", "serve")}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    s, r2 = serve_result(so)
    r.update(r2)
    r["train_steps_per_s"] = steps_per_s(to, s["t0"], s["t1"])
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval-ms", type=float, default=12.0)
    ap.add_argument("--configs", default="ideal,train-alone,mps,default")
    ap.add_argument("--rounds", type=int, default=1, help="each configuration this many times, "
                    "in rotated order (results named CONFIG@ROUND after the first round)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set for mmkd and the jobs of every mmkd configuration")
    a = ap.parse_args()
    bin_dir, out = os.path.abspath(a.bin), os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mmk-default-path-")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MMK_", "CUDA_MPS_"))} | {"PYTHONUNBUFFERED": "1"}
    serve = [sys.executable, APP, "serve", "--batch", "4", "--interval-ms", str(a.interval_ms)]
    res = {"setup": vars(a), "configs": {}, "gpu": subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip(), "date": time.strftime("%Y-%m-%d")}
    try:
        listed = a.configs.split(",")
        runs = []
        for rnd in range(1, a.rounds + 1):
            for i in range(len(listed)):
                c = listed[(i + rnd - 1) % len(listed)]
                runs.append((c, c if rnd == 1 else f"{c}@{rnd}"))
        for c, name in runs:
            d = f"{work}/{name}"
            os.makedirs(d)
            so, to = f"{d}/serve.json", f"{d}/train.json"
            r = {}
            t = time.time()
            if c in ("ideal", "ideal-interposer"):
                # ideal-interposer: the same with the interposer preloaded and no gate (it
                # counts launches, holds and tracks nothing): what the hooks alone cost.
                pre = ({"LD_PRELOAD": f"{bin_dir}/libmmk_interposer.so"}
                       if c == "ideal-interposer" else {})
                subprocess.run(serve + ["--seconds", str(a.seconds), "--out", so],
                               env=env | pre, check=True, capture_output=True)
                _, r = serve_result(so)
            elif c == "train-alone":
                p = subprocess.Popen([sys.executable, APP, "train", "--seconds", "600", "--out", to],
                                     env=env, stderr=open(f"{d}/train.err", "w"))
                wait_file_line(f"{d}/train.err", "train: warm", 180)
                # colocate.py's step times are time.monotonic(), one clock for every process.
                t0 = time.monotonic()
                time.sleep(a.seconds)
                t1 = time.monotonic()
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=60)
                r["train_steps_per_s"] = steps_per_s(to, t0, t1)
            else:
                # Suffixes "-pollN" (the interposer's poller sleeps at least N us) and
                # "-perlaunch" (an event per launch), in any order.
                extra = {}
                alt_so = "-altso" in c
                c = c.replace("-altso", "")
                if "-hooksonly" in c:
                    c = c.replace("-hooksonly", "")
                    extra["MMK_KSCHED_OFF"] = "1"
                if "-perlaunch" in c:
                    c = c.replace("-perlaunch", "")
                    extra["MMK_KSCHED_EVENTS"] = "launch"
                offmax = []
                if "-offmax" in c:
                    head, _, rest = c.rpartition("-offmax")
                    pct, _, more = rest.partition("-")
                    c = head + (f"-{more}" if more else "")
                    offmax = ["--offline-share-max", pct]
                if "-poll" in c:
                    head, _, rest = c.rpartition("-poll")
                    us, _, more = rest.partition("-")
                    c = head + (f"-{more}" if more else "")
                    extra["MMK_KSCHED_POLL_US"] = us
                flags = {
                    "mps": ["--planner", "first-fit", "--kernel-policy", "off"],
                    "default": [],
                    "learned": [],
                    "default-ksoff": ["--kernel-policy", "off"],
                    "default-tuned": ["--kernel-device-wait", "--kernel-offline-depth", "8",
                                      "--kernel-base", "1500us", "--kernel-gemm-slice", "8000",
                                      "--kernel-gate-dir", tempfile.mkdtemp(dir="/dev/shm")],
                }.get(c)
                if flags is None and c.startswith("default-budget"):
                    flags = ["--kernel-hold-budget", c.removeprefix("default-budget")]
                if flags is None and c.startswith("mps-policy-"):
                    flags = ["--planner", "first-fit", "--kernel-policy", c.removeprefix("mps-policy-")]
                if flags is None and c.startswith("default-policy-"):
                    flags = ["--kernel-policy", c.removeprefix("default-policy-")]
                if flags is None:
                    raise SystemExit(f"{c}: not a configuration")
                flags = flags + offmax
                if alt_so:
                    flags = flags + ["--interposer", f"{bin_dir}/alt/libmmk_interposer.so"]
                m = Mmkd(bin_dir, d, flags,
                         env | dict(kv.split("=", 1) for kv in a.env) | extra,
                         f"{out}/mmkd-{name}.log")
                try:
                    r = pair(m, d, out, serve, a.seconds)
                    if c == "learned":
                        # The same two commands again, on what mmkd learned of the first run.
                        r = {"first": r, "profiles": m.ctl("profiles")}
                        r["second"] = pair(m, d, out, serve, a.seconds)
                finally:
                    m.stop()
                r["planner_log"] = [l.strip() for l in open(f"{out}/mmkd-{name}.log")
                                    if "performance model" in l or "planner" in l][:3]
            r["wall_s"] = round(time.time() - t, 1)
            res["configs"][name] = r
            res["summary"] = summarize(res["configs"])
            log(name, json.dumps(brief(r)))
            json.dump(res, open(f"{out}/default-path.json", "w"), indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
