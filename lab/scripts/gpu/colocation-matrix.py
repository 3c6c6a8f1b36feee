"""The co-location matrix: every online service beside every offline training, under each
sharing configuration, judged as Tally judges it (the mean online p99 over alone, and the
training's throughput against plain MPS's, over the matrix).

Services (lab/scripts/gpu/colocate.py `serve`, Poisson arrivals; the mean interval is chosen
when the service runs alone so that it is busy half the time, and every configuration
replays the same arrivals at that interval):
  resnet50   ResNet-50, batch 4
  bert       BERT-base inference, batch 8 x 128
  llm        a 350M-parameter GPT-2-style decoder, 32-token prompt, 8 tokens one by one
             (its window twice as long)
Trainings (colocate.py `train`): bert (BERT-base masked LM, batch 8), resnet152 (batch 32).

Configurations:
  alone      each job by itself, started directly (no MPS, no mmkd)
  timeslice  both started directly, no MPS: the driver time-slices the two contexts
  mps        one MPS control daemon of this script's, both clients at 100 %, no priority
  mps-prio   the same, the training with CUDA_MPS_CLIENT_PRIORITY=1 (below normal)
  mmk        `mmkd --backend nvml` with every setting at its default, both jobs through
             `mmkctl run` with no profile (the learned profiles take over once they exist)
  mmk-ksoff  the same with `--kernel-policy off` (MMK's shares, no kernel gate)
  mmk-passthrough  the same with `--kernel-policy passthrough` (the interposer, no holds)
  mmk-budgetN  the same with `--kernel-policy mmk --kernel-hold-budget N` (the gate holds
             offline launches while online work is in flight, at most N % of the time)
  mmk-devwait  the same with `--kernel-device-wait --kernel-base 1500us` (the GPU holds the
             training's queued kernels while the service's are in flight, at most 1.5 ms
             over the training's share before it is forced open; gates in /dev/shm)
  mmk-devwait-slice  the same and `--kernel-gemm-slice 8000` (the training's GEMMs over
             8 GFLOP cut into pieces)
  mmk-devwait-grainN  mmk-devwait with `--kernel-device-wait-grain Nus` (a wait only once
             N us of the training's expected work were launched since the last one)
  mmk-offshareN  mmk with `--offline-share-max N` (the training's MPS share at most N %:
             its kernels never take more of the GPU's SMs)

Per training and shared configuration the training starts once, and each service runs
beside it in turn; the training's throughput is counted over each service's window.
Per pair and configuration: the service's p50 and p99 over alone, the training's
throughput over alone and over plain MPS's, and the system throughput (the service's
requests served per second over alone plus the training's steps per second over alone;
the service's arrivals are fixed, so its part is about 1 unless it fell behind, and the
figure moves with the training's).

`--record` also runs each job alone once more (after the alone runs) under the interposer in record mode
(MMK_KSCHED_RECORD, `--record-seconds`), for `mmk-lab ksim`; the traces are packed into
OUT/traces.tar.gz.

Usage, on the GPU machine from the repo root:
  python3 lab/scripts/gpu/colocation-matrix.py BIN_DIR OUT_DIR [--trainings bert,resnet152]
      [--services resnet50,bert,llm] [--configs timeslice,mps,mps-prio,mmk] [--seconds S]
      [--load F] [--record]
BIN_DIR holds mmkd, mmkctl and libmmk_interposer.so (release builds). Writes
OUT/matrix.json (every run), OUT/colocation-matrix-GPU.json (the summary the docs give)
and OUT/logs.tar.gz (mmkd's logs); changes no GPU setting. Several calls' matrix.json
files merge with `--merge OUT A.json B.json ...` into OUT/colocation-matrix-GPU.json's
`tiers.eager` (a `tiers.graph` already there, from graph-tier.py, stays; runs on other
machines are not mixed: each pair's ratios are against its own call's alone runs; `--rename
mmk=mmk-budget10` names a configuration run under mmkd's defaults of the day by its
settings, in every call, and `--rename FILE:mmk=mmk-budget10` in that call's file only).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import import_module

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
APP = os.path.join(HERE, "colocate.py")
dp = import_module("default-path")
pct, log = dp.pct, dp.log

SERVICES = {"resnet50": ["--model", "resnet50", "--batch", "4"],
            "bert": ["--model", "bert", "--batch", "8"],
            "llm": ["--model", "llm", "--batch", "1"]}
DEVICE_WAIT = ["--kernel-device-wait", "--kernel-base", "1500us",
               "--kernel-gate-dir", "/dev/shm/mmk-colocation-matrix"]
MMK_FLAGS = {"mmk": [], "mmk-ksoff": ["--kernel-policy", "off"],
             "mmk-passthrough": ["--kernel-policy", "passthrough"],
             "mmk-devwait": DEVICE_WAIT,
             "mmk-devwait-slice": DEVICE_WAIT + ["--kernel-gemm-slice", "8000"]}


def mmk_flags(config):
    """mmkd's flags for an `mmk...` configuration; None for another."""
    if config in MMK_FLAGS:
        return MMK_FLAGS[config]
    share = config.removeprefix("mmk-offshare")
    if config.startswith("mmk-offshare") and share.isdigit():
        return ["--offline-share-max", share]
    grain = config.removeprefix("mmk-devwait-grain")
    if config.startswith("mmk-devwait-grain") and grain.isdigit():
        return DEVICE_WAIT + ["--kernel-device-wait-grain", f"{grain}us"]
    if config.startswith("mmk-budget") and config.removeprefix("mmk-budget").isdigit():
        return ["--kernel-policy", "mmk", "--kernel-hold-budget",
                config.removeprefix("mmk-budget")]
    return None


def serve_cmd(name, seconds, out, interval_ms=None, load=None):
    # The LLM's requests are the longest: twice the window, for enough of them.
    seconds = seconds * 2 if name == "llm" else seconds
    cmd = [sys.executable, APP, "serve", *SERVICES[name], "--seconds", str(seconds),
           "--out", out]
    if interval_ms:
        cmd += ["--interval-ms", f"{interval_ms:.4f}"]
    else:
        cmd += ["--load", str(load)]
    return cmd


def train_cmd(kind, out):
    return [sys.executable, APP, "train", "--kind", kind, "--seconds", "900", "--out", out]


def stop(p, timeout=120):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Mps:
    """One MPS control daemon with private pipe and log directories."""

    def __init__(self, work, env):
        self.env = dict(env, CUDA_MPS_PIPE_DIRECTORY=f"{work}/mps/pipe",
                        CUDA_MPS_LOG_DIRECTORY=f"{work}/mps/log")
        os.makedirs(f"{work}/mps/pipe", exist_ok=True)
        os.makedirs(f"{work}/mps/log", exist_ok=True)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True)
        time.sleep(1)

    def quit(self):
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=self.env)
        time.sleep(2)


def alone_service(name, seconds, load, d, env):
    so = f"{d}/alone-{name}.json"
    subprocess.run(serve_cmd(name, seconds, so, load=load), env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=open(f"{d}/alone-{name}.err", "w"))
    s, r = dp.serve_result(so)
    r["interval_ms"] = s["interval_ms"]
    r["served_per_s"] = len(s["latencies_s"]) / (s["t1"] - s["t0"])
    return r


def alone_training(kind, seconds, d, env):
    to, err = f"{d}/alone-{kind}.json", f"{d}/alone-{kind}.err"
    p = subprocess.Popen(train_cmd(kind, to), env=env, stderr=open(err, "w"))
    try:
        dp.wait_file_line(err, "train: warm", 300)
        t0 = time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
    finally:
        stop(p)
    return {"train_steps_per_s": dp.steps_per_s(to, t0, t1)}


def block(config, kind, services, alone, seconds, bin_dir, d, env, logs):
    """One training under `config`, each service beside it in turn: {service: result}."""
    out, procs, mps, m = {}, [], None, None
    to = f"{d}/train.json"
    # The jobs' stderr (and mmkd's log) go to `logs`/KIND-CONFIG, kept in OUT/logs.tar.gz.
    errs = f"{logs}/{kind}-{config}"
    os.makedirs(errs)
    try:
        if mmk_flags(config) is not None:
            m = dp.Mmkd(bin_dir, d, mmk_flags(config), env, f"{errs}/mmkd.log")
            procs.append(m.run("offline", "24G", "train", train_cmd(kind, to)))
            m.wait_running("train", 120)
            # mmkctl run's command writes to mmkctl's stderr (Mmkd.run sends it to
            # NAME.err beside mmkd's log).
            dp.wait_file_line(f"{errs}/train.err", "train: warm", 300)
        else:
            on_env, off_env = dict(env), dict(env)
            if config in ("mps", "mps-prio"):
                mps = Mps(d, env)
                on_env, off_env = dict(mps.env), dict(mps.env)
                if config == "mps-prio":
                    on_env["CUDA_MPS_CLIENT_PRIORITY"] = "0"
                    off_env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
            elif config != "timeslice":
                raise SystemExit(f"{config}: not a configuration")
            procs.append(subprocess.Popen(train_cmd(kind, to), env=off_env,
                                          stderr=open(f"{errs}/train.err", "w")))
            dp.wait_file_line(f"{errs}/train.err", "train: warm", 300)
        for name in services:
            so = f"{d}/serve-{name}.json"
            cmd = serve_cmd(name, seconds, so, interval_ms=alone[name]["interval_ms"])
            r = {}
            if m:
                asked = time.time()
                p = m.run("online", "16G", f"serve-{name}", cmd)
                sj = m.wait_running(f"serve-{name}", 120)
                r["online_start_s"] = round(time.time() - asked, 3)
                tj = m.job("train")
                r["assignment"] = {"online": sj["assignment"], "offline": tj["assignment"]}
                r["planned_as"] = {"online": sj.get("planner_profile"),
                                   "offline": tj.get("planner_profile")}
                p.wait(timeout=seconds + 300)
                if p.returncode != 0:
                    raise RuntimeError(f"serve-{name} exited {p.returncode}: "
                                       f"{open(f'{errs}/serve-{name}.err').read()[-2000:]}")
            else:
                subprocess.run(cmd, env=on_env, check=True, stdout=subprocess.DEVNULL,
                               stderr=open(f"{errs}/serve-{name}.err", "w"))
            s, lat = dp.serve_result(so)
            r.update(lat)
            r["served_per_s"] = len(s["latencies_s"]) / (s["t1"] - s["t0"])
            r["window"] = (s["t0"], s["t1"])
            out[name] = r
        if m:
            try:
                out["_gates"] = [{k: s.get(k) for k in ("class", "launches", "held", "held_us",
                                                         "forced", "max_held_us")}
                                 for g in m.ctl("partitions", "show")
                                 for p in g.get("partitions", [])
                                 for s in ((p.get("gate") or {}).get("processes") or [])]
                out["_profiles"] = m.ctl("profiles")
            except (RuntimeError, ValueError, AttributeError, TypeError) as e:
                out["_gates"] = str(e)
    finally:
        for p in procs:
            stop(p)
        if m:
            m.stop()
        if mps:
            mps.quit()
    for name in services:
        t0, t1 = out[name].pop("window")
        out[name]["train_steps_per_s"] = dp.steps_per_s(to, t0, t1)
    return out


def record(services, trainings, alone, seconds, bin_dir, d, env, dest):
    """Each job alone under the interposer in record mode; the traces land in `dest`."""
    os.makedirs(dest, exist_ok=True)
    pre = {"LD_PRELOAD": f"{bin_dir}/libmmk_interposer.so"}
    for name in services:
        e = env | pre | {"MMK_KSCHED_RECORD": f"{dest}/serve-{name}.%p.csv",
                         "MMK_JOB_CLASS": "online"}
        subprocess.run(serve_cmd(name, seconds, f"{d}/rec-{name}.json",
                                 interval_ms=alone[name]["interval_ms"]),
                       env=e, check=True, stdout=subprocess.DEVNULL,
                       stderr=open(f"{d}/rec-{name}.err", "w"))
    for kind in trainings:
        e = env | pre | {"MMK_KSCHED_RECORD": f"{dest}/train-{kind}.%p.csv",
                         "MMK_JOB_CLASS": "offline"}
        err = f"{d}/rec-{kind}.err"
        p = subprocess.Popen(train_cmd(kind, f"{d}/rec-{kind}.json"), env=e,
                             stderr=open(err, "w"))
        try:
            dp.wait_file_line(err, "train: warm", 300)
            time.sleep(seconds)
        finally:
            stop(p)


def summarize(res):
    """Per pair and configuration the ratios; per configuration their means over the pairs."""
    pairs = []
    for kind, by_config in res["blocks"].items():
        if f"train-{kind}" not in res["alone"]:
            continue
        train_alone = res["alone"][f"train-{kind}"]["train_steps_per_s"]
        for name in res["setup"]["services"]:
            alone = res["alone"].get(name)
            if not alone:
                continue
            mps = (by_config.get("mps") or {}).get(name, {}).get("train_steps_per_s")
            pair = {"online": name, "offline": kind, "alone": {
                "p50_ms": alone["p50_ms"], "p99_ms": alone["p99_ms"],
                "interval_ms": alone["interval_ms"], "train_steps_per_s": train_alone},
                "configs": {}}
            for config, runs in by_config.items():
                r = runs.get(name)
                if not r:
                    continue
                c = {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
                     "p50_ratio": r["p50_ms"] / alone["p50_ms"],
                     "p99_ratio": r["p99_ms"] / alone["p99_ms"],
                     "train_steps_per_s": r["train_steps_per_s"],
                     "train_vs_alone": r["train_steps_per_s"] / train_alone,
                     "train_vs_mps": r["train_steps_per_s"] / mps if mps else None,
                     "system_throughput": r["served_per_s"] / alone["served_per_s"]
                     + r["train_steps_per_s"] / train_alone}
                for k in ("assignment", "planned_as", "online_start_s"):
                    if k in r:
                        c[k] = r[k]
                pair["configs"][config] = c
            pairs.append(pair)
    return {"gpu": res["gpu"], "driver": res["driver"], "date": res["date"],
            "command": res["command"], "pairs": pairs, "configs": summarize_pairs(pairs)}


def gpu_name():
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().splitlines()
    name, _, driver = (q[0] if q else "unknown, unknown").partition(", ")
    return name, driver


def short(gpu):
    """"NVIDIA H100 80GB HBM3" -> "h100"."""
    for word in gpu.lower().split():
        if word[:1] in "abhl" and any(ch.isdigit() for ch in word):
            return word
    return "gpu"


def merge(out, files, rename=()):
    """One matrix from several calls' matrix.json of the same GPU model. A pair measured in
    several calls gets each configuration's figures from every call that ran it (each
    against its own call's alone runs and plain MPS), averaged, with `calls` saying how many."""
    runs = [json.load(open(f)) for f in files]
    if len({short(r["gpu"]) for r in runs}) != 1:
        raise SystemExit("the calls ran on different GPU models")
    # A configuration named by what mmkd's defaults were then ("mmk") gets its settings' name:
    # OLD=NEW in every call, FILE:OLD=NEW in that call's file only (winning over OLD=NEW).
    names, per_file = {}, {}
    merged_files = {os.path.normpath(f) for f in files}
    for spec in rename:
        where, colon, kv = spec.rpartition(":")
        old, _, new = kv.partition("=")
        where = os.path.normpath(where) if colon else ""
        if not old or not new or (colon and where not in merged_files):
            raise SystemExit(f"--rename {spec}: not OLD=NEW or FILE:OLD=NEW with FILE merged")
        (per_file.setdefault(where, {}) if colon else names)[old] = new
    for f, r in zip(files, runs):
        these = names | per_file.get(os.path.normpath(f), {})
        for kind in r["blocks"]:
            block = {}
            for c, v in r["blocks"][kind].items():
                name = these.get(c, c)
                if name in block:
                    raise SystemExit(f"--rename: {f} would have two configurations named {name}")
                block[name] = v
            r["blocks"][kind] = block
    by_pair = {}
    for r in runs:
        for p in summarize(r)["pairs"]:
            key = (p["online"], p["offline"])
            q = by_pair.setdefault(key, {"online": p["online"], "offline": p["offline"],
                                         "alone": [], "configs": {}})
            q["alone"].append(p["alone"])
            for config, c in p["configs"].items():
                q["configs"].setdefault(config, []).append(c)
    pairs = []
    for q in by_pair.values():
        configs = {}
        for config, cs in q["configs"].items():
            merged = {"calls": len(cs)}
            for k, v in cs[-1].items():
                # A figure some calls lack (train_vs_mps without plain MPS in that call) is
                # the mean of those that have it; the rest is the last call's.
                nums = [c[k] for c in cs if isinstance(c.get(k), (int, float))
                        and not isinstance(c.get(k), bool)]
                merged[k] = statistics.fmean(nums) if nums else v
            configs[config] = merged
        pairs.append({"online": q["online"], "offline": q["offline"], "alone": q["alone"],
                      "configs": configs})
    eager = {"date": max(r["date"] for r in runs), "command": [r["command"] for r in runs],
             "renamed": names | {f"{f}:{o}": n for f, m in per_file.items() for o, n in m.items()},
             "pairs": pairs, "configs": summarize_pairs(pairs)}
    os.makedirs(out, exist_ok=True)
    path = f"{out}/colocation-matrix-{short(runs[0]['gpu'])}.json"
    # The graph tier (graph-tier.py) of a matrix already there stays.
    tiers = {"eager": eager}
    if os.path.exists(path) and "graph" in json.load(open(path)).get("tiers", {}):
        tiers["graph"] = json.load(open(path))["tiers"]["graph"]
    merged = {"gpu": runs[0]["gpu"], "driver": runs[0]["driver"], "tiers": tiers}
    json.dump(merged, open(path, "w"), indent=1)
    log(path)


def summarize_pairs(pairs):
    """Per configuration the means of its pairs' ratios, and its worst pair by p99."""
    configs = {}
    for config in sorted({c for p in pairs for c in p["configs"]}):
        cs = [(p, p["configs"][config]) for p in pairs if config in p["configs"]]
        worst = max(cs, key=lambda pc: pc[1]["p99_ratio"])
        mean = {k: statistics.fmean(x) if (x := [c[k] for _, c in cs if c.get(k) is not None])
                else None for k in ("p50_ratio", "p99_ratio", "train_vs_alone", "train_vs_mps",
                                    "system_throughput")}
        configs[config] = {"pairs": len(cs), **{f"mean_{k}": v for k, v in mean.items()},
                           "worst_p99_pair": f"{worst[0]['online']}+{worst[0]['offline']}",
                           "worst_p99_ratio": worst[1]["p99_ratio"]}
    return configs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin", nargs="?")
    ap.add_argument("out")
    ap.add_argument("--trainings", default="bert,resnet152")
    ap.add_argument("--services", default="resnet50,bert,llm")
    ap.add_argument("--configs", default="timeslice,mps,mps-prio,mmk")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--record-seconds", type=float, default=3.0)
    ap.add_argument("--merge", nargs="+", metavar="MATRIX_JSON")
    ap.add_argument("--rename", action="append", default=[], metavar="[FILE:]OLD=NEW",
                    help="with --merge: a configuration's name in the calls' files (or in FILE "
                    "only), and its name in the merged matrix")
    a = ap.parse_args()
    if a.merge:
        return merge(a.out, a.merge, a.rename)
    if a.bin is None:
        ap.error("BIN_DIR is needed unless --merge")
    bin_dir, out = os.path.abspath(a.bin), os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mmk-matrix-")
    logs = f"{work}/logs"
    os.makedirs(logs)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MMK_", "CUDA_MPS_"))} | {"PYTHONUNBUFFERED": "1"}
    services, trainings = a.services.split(","), a.trainings.split(",")
    for s in services:
        if s not in SERVICES:
            raise SystemExit(f"--services: {s}: not one of {', '.join(SERVICES)}")
    gpu, driver = gpu_name()
    res = {"setup": vars(a) | {"services": services, "trainings": trainings}, "gpu": gpu,
           "driver": driver, "date": time.strftime("%Y-%m-%d"),
           "command": " ".join(["python3", "lab/scripts/gpu/colocation-matrix.py", *sys.argv[1:]]),
           "alone": {}, "blocks": {}}

    def save():
        json.dump(res, open(f"{out}/matrix.json", "w"), indent=1)
        if res["blocks"]:
            eager = summarize(res)
            head = {k: eager.pop(k) for k in ("gpu", "driver")}
            json.dump(head | {"tiers": {"eager": eager}},
                      open(f"{out}/colocation-matrix-{short(gpu)}.json", "w"), indent=1)

    try:
        for name in services:
            res["alone"][name] = alone_service(name, a.seconds, a.load, logs, env)
            log("alone", name, json.dumps(dp.brief(res["alone"][name])))
        for kind in trainings:
            res["alone"][f"train-{kind}"] = alone_training(kind, a.seconds, logs, env)
            log("alone", kind, json.dumps(res["alone"][f"train-{kind}"]))
        save()
        if a.record:
            record(services, trainings, res["alone"], a.record_seconds, bin_dir, logs, env,
                   f"{work}/traces")
        for kind in trainings:
            res["blocks"][kind] = {}
            for config in a.configs.split(","):
                d = f"{work}/{kind}-{config}"
                os.makedirs(d)
                t = time.time()
                try:
                    r = block(config, kind, services, res["alone"], a.seconds, bin_dir, d, env,
                              logs)
                except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                    r = {"error": str(e)[-3000:]}
                    log(kind, config, "failed:", r["error"])
                r["_wall_s"] = round(time.time() - t, 1)
                res["blocks"][kind][config] = r
                log(kind, config, json.dumps({k: dp.brief(v) for k, v in r.items()
                                              if k != "_profiles"}))
                save()
    finally:
        for name, src in (("logs", logs), ("traces", f"{work}/traces")):
            if os.path.isdir(src):
                with tarfile.open(f"{out}/{name}.tar.gz", "w:gz") as t:
                    t.add(src, arcname=name)
        save()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
