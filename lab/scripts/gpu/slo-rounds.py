"""A service as production engines run it (one CUDA graph replay per request) beside a
training, under plain MPS and mmkd's configurations, judged by the protocol of
docs/colocation.md ("How a claim is judged"):

 1. three runs of the service alone (no MPS, no mmkd; `--alone-seconds` each); their p99s
    must agree within 10 %,
    or the call says the host is too noisy and stops (`--noisy-ok`: it says so and goes
    on, and no claim rests on that call);
 2. rounds: every configuration once per round, in the same order, `--rounds` of them;
 3. per round, each configuration's p99 over plain MPS's in that round and over the mean
    p99 alone, and its training's throughput over plain MPS's in that round; a claim
    "X is no worse than Y" holds when the geometric mean of the per-round ratios, over
    every round of every call, is at most 1.05.

Configurations (the service and the training start as `--as-user`, a non-root user this
script makes and removes, unless `--as-user root`):
  mps          one MPS control daemon of this script's, both clients at 100 %
  mmk          `mmkd --backend nvml` with its defaults (the SLO control on, every online job
               held to the default objective, 3x its p99 alone); the gates in /dev/shm, a
               memory file system, as the Debian package puts them in /run/mmk
  mmk-noslo    the same with `--no-slo-control` (mmkd's defaults before the control)
  mmk-sloNx    mmk, the service started with `mmkctl run --slo Nx` (N: 2, 4, 1.5 ...)
  mmk-devwait  `--no-slo-control --kernel-device-wait --kernel-base 1500us`: the device
               wait always on (a static configuration)
Both jobs of an mmk configuration start with `mmkctl run`, the training first; the
service's first `--warm` seconds of requests are not measured (the SLO control settles);
mmkctl's view of the service's SLO status is read every second while it runs.

Usage, on the GPU machine from the repo root, as root:
  python3 lab/scripts/gpu/slo-rounds.py BIN OUT [--service resnet50] [--training bert]
      [--configs mps,mmk-noslo,mmk,mmk-slo2x] [--rounds 4] [--seconds 5] [--warm 8]
      [--load 0.5] [--alone-seconds 10] [--as-user mmk-slo]
BIN holds release builds of mmkd, mmkctl and libmmk_interposer.so. Writes
OUT/slo-rounds.json (every run, after each one) and OUT/summary.txt; changes no GPU
setting.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import import_module

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
cm = import_module("colocation-matrix")
dp = cm.dp
log = dp.log

GATES = "/dev/shm/mmk-slo-rounds"
FLAGS = {"mmk": [], "mmk-noslo": ["--no-slo-control"],
         "mmk-devwait": ["--no-slo-control", "--kernel-device-wait", "--kernel-base", "1500us"]}


def mmk_flags(config):
    """mmkd's flags and the service's `--slo` for an mmk configuration; None for another."""
    if config in FLAGS:
        return FLAGS[config], None
    slo = config.removeprefix("mmk-slo")
    if config.startswith("mmk-slo") and slo.endswith("x"):
        return [], slo
    return None


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


class User:
    """The non-root user the jobs run as (made here, removed at the end), or root."""

    def __init__(self, name):
        self.name, self.made = name, False
        if name != "root" and subprocess.run(["id", name], capture_output=True).returncode:
            subprocess.run(["groupadd", "-f", name], check=True)
            subprocess.run(["useradd", "-M", "-g", name, "-s", "/bin/sh", name], check=True)
            self.made = True

    def popen(self, args, env, **kw):
        """`args` started as this user (its own group, HOME in /tmp)."""
        if self.name != "root":
            kw |= {"user": self.name, "group": self.name, "extra_groups": []}
            env = dict(env, HOME="/tmp")
        return subprocess.Popen(args, env=env, **kw)

    def run(self, args, env, **kw):
        p = self.popen(args, env, **kw)
        if p.wait() != 0:
            raise RuntimeError(f"{args[:4]} exited {p.returncode}")

    def remove(self):
        if self.made:
            subprocess.run(["pkill", "-u", self.name], capture_output=True)
            time.sleep(1)
            subprocess.run(["userdel", self.name], capture_output=True)
            subprocess.run(["groupdel", self.name], capture_output=True)


def serve_cmd(a, out, interval_ms=None, load=None, seconds=None):
    cmd = cm.serve_cmd(a.service, seconds or a.seconds, out, interval_ms=interval_ms, load=load)
    return cmd + ["--graph"] + (["--warm-seconds", str(a.warm)] if interval_ms else [])


def run_alone(a, user, d, env, i):
    so = f"{d}/alone-{i}.json"
    user.run(serve_cmd(a, so, load=a.load, seconds=a.alone_seconds), env,
             stdout=subprocess.DEVNULL,
             stderr=open(f"{d}/alone-{i}.err", "w"))
    s, r = dp.serve_result(so)
    r["interval_ms"] = s["interval_ms"]
    return r


def one(config, a, user, interval_ms, bin_dir, d, env):
    """The training and the service under `config`: the service's latencies, the training's
    steps per second over the service's window, what mmkd said of the service's SLO."""
    # mmkd's folder is root's; what the jobs write goes to io/, which they may write.
    io = f"{d}/io"
    os.makedirs(io)
    os.chmod(io, 0o777)
    to, so = f"{io}/train.json", f"{io}/serve.json"
    procs, mps, m, r = [], None, None, {}
    try:
        mk = mmk_flags(config)
        if mk is not None:
            flags, slo = mk
            m = dp.Mmkd(bin_dir, d, ["--socket-group", user.name, "--kernel-gate-dir", GATES,
                                     *flags], env, f"{d}/mmkd.log")

            def run(cls, memory, name, cmd, extra=()):
                return user.popen([m.ctl_bin, "--socket", m.sock, "run", f"--{cls}",
                                   "--memory", memory, "--name", name, *extra, "--", *cmd],
                                  env, stdout=subprocess.DEVNULL,
                                  stderr=open(f"{d}/{name}.err", "w"))
            procs.append(run("offline", "24G", "train", cm.train_cmd(a.training, to)))
            m.wait_running("train", 120)
            dp.wait_file_line(f"{d}/train.err", "train: warm", 300)
            p = run("online", "16G", "serve", serve_cmd(a, so, interval_ms=interval_ms),
                    ["--slo", slo] if slo else [])
            m.wait_running("serve", 120)
            statuses = []
            while p.poll() is None:
                time.sleep(1)
                try:
                    j = m.job("serve")
                    if j and j.get("slo_status"):
                        statuses.append(dict(j["slo_status"], t=time.monotonic()))
                except (RuntimeError, ValueError):
                    pass
            if p.returncode != 0:
                raise RuntimeError(f"serve exited {p.returncode}: {open(f'{d}/serve.err').read()[-2000:]}")
            r["slo_status"] = statuses
        else:
            mps = cm.Mps(d, env)
            # Clients of another user reach the daemon's pipes.
            subprocess.run(["chmod", "-R", "a+rwX", f"{d}/mps"], check=True)
            procs.append(user.popen(cm.train_cmd(a.training, to), mps.env,
                                    stderr=open(f"{d}/train.err", "w")))
            dp.wait_file_line(f"{d}/train.err", "train: warm", 300)
            user.run(serve_cmd(a, so, interval_ms=interval_ms), mps.env,
                     stdout=subprocess.DEVNULL, stderr=open(f"{d}/serve.err", "w"))
        s, lat = dp.serve_result(so)
        r.update(lat)
        r["served"] = len(s["latencies_s"])
        window = (s["t0"], s["t1"])
    finally:
        for p in procs:
            cm.stop(p)
        if m:
            m.stop()
        if mps:
            mps.quit()
    r["train_steps_per_s"] = dp.steps_per_s(to, *window)
    if r.get("slo_status"):
        # What mmkd said over the measured window only.
        r["slo_status"] = [st for st in r["slo_status"] if st.pop("t") >= window[0]]
    return r


def summarize(res):
    """Per configuration: the geometric means over rounds of p99 over plain MPS's and over
    alone, and of the training over plain MPS's."""
    alone = statistics.mean(x["p99_ms"] for x in res["alone"])
    out = {"alone_p99_ms": alone, "configs": {}}
    rounds = [r for r in res["rounds"] if "mps" in r and "error" not in r["mps"]]
    for config in res["setup"]["configs"].split(","):
        per = [(r[config], r["mps"]) for r in rounds if config in r and "error" not in r[config]]
        if not per:
            continue
        out["configs"][config] = {
            "rounds": len(per),
            "p99_ms": [c["p99_ms"] for c, _ in per],
            "p99_vs_alone": geomean([c["p99_ms"] / alone for c, _ in per]),
            "p99_vs_mps": geomean([c["p99_ms"] / m["p99_ms"] for c, m in per]),
            "train_vs_mps": geomean([c["train_steps_per_s"] / m["train_steps_per_s"]
                                     for c, m in per]),
            "isolation_seen": sorted({st["isolation"] for c, _ in per
                                      for st in c.get("slo_status", [])}),
        }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("out")
    ap.add_argument("--service", default="resnet50", choices=sorted(cm.SERVICES))
    ap.add_argument("--training", default="bert")
    ap.add_argument("--configs", default="mps,mmk-noslo,mmk,mmk-slo2x")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warm", type=float, default=8.0)
    ap.add_argument("--alone-seconds", type=float, default=10.0)
    ap.add_argument("--noisy-ok", action="store_true",
                    help="go on when the alone runs disagree (the verdict says so)")
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--as-user", default="mmk-slo")
    a = ap.parse_args()
    bin_dir, out = os.path.abspath(a.bin), os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mmk-slo-")
    os.chmod(work, 0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MMK_", "CUDA_MPS_"))} | {"PYTHONUNBUFFERED": "1"}
    gpu, driver = cm.gpu_name()
    res = {"setup": vars(a), "gpu": gpu, "driver": driver, "date": time.strftime("%Y-%m-%d"),
           "command": " ".join(["python3", "lab/scripts/gpu/slo-rounds.py", *sys.argv[1:]]),
           "alone": [], "rounds": []}
    user = User(a.as_user)

    def save():
        if res["alone"]:
            res["summary"] = summarize(res)
        json.dump(res, open(f"{out}/slo-rounds.json", "w"), indent=1)

    try:
        d = f"{work}/alone"
        os.makedirs(d)
        os.chmod(d, 0o777)
        for i in range(3):
            res["alone"].append(run_alone(a, user, d, env, i))
            log("alone", i, json.dumps(dp.brief(res["alone"][-1])))
        save()
        p99s = [x["p99_ms"] for x in res["alone"]]
        if max(p99s) > 1.10 * min(p99s):
            res["verdict"] = f"the host is too noisy: alone p99 {p99s} ms differ by over 10 %"
            log(res["verdict"])
            if not a.noisy_ok:
                return
            res["verdict"] += " (went on with --noisy-ok: no claim rests on this call)"
        interval = statistics.mean(x["interval_ms"] for x in res["alone"])
        for k in range(a.rounds):
            res["rounds"].append({})
            for config in a.configs.split(","):
                t = time.time()
                try:
                    r = one(config, a, user, interval, bin_dir, f"{work}/r{k}-{config}", env)
                except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                    r = {"error": str(e)[-2000:]}
                r["_wall_s"] = round(time.time() - t, 1)
                res["rounds"][-1][config] = r
                log("round", k, config, json.dumps({x: r.get(x) for x in
                                                    ("p50_ms", "p99_ms", "train_steps_per_s",
                                                     "error", "_wall_s")}),
                    json.dumps((r.get("slo_status") or [{}])[-1:]))
                save()
    finally:
        save()
        with open(f"{out}/summary.txt", "w") as f:
            f.write(json.dumps(res.get("summary"), indent=1) + "\n" + res.get("verdict", "") + "\n")
        subprocess.run(["tar", "czf", f"{out}/logs.tar.gz", "-C", work, "."], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(GATES, ignore_errors=True)
        user.remove()


if __name__ == "__main__":
    main()
