"""The GPU's clocks and power during each run of a co-location call.

  python3 lab/scripts/gpu/clocks-by-run.py clocks.csv rounds.json

clocks.csv is what `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,
utilization.gpu --format=csv,noheader,nounits -lms 100` wrote during the call (it only
reads; it sets nothing); rounds.json is ksched-colocate.py's, whose runs carry the service's
window in Unix seconds (`window_unix_s`). Prints, per configuration (all its rounds), the
samples inside the service's windows: SM clock p10/p50/p90 (MHz), mean power (W) and GPU
utilization (%). nvidia-smi writes local time and this reads it as local time: run it on
the machine that took the log, or with its TZ. It warns when no sample falls in any run.
"""
import datetime
import json
import statistics
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: clocks-by-run.py clocks.csv rounds.json")
    samples = []
    for n, line in enumerate(open(sys.argv[1]), 1):
        f = [x.strip() for x in line.split(",")]
        if len(f) != 5:
            continue
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(f[1]), float(f[2]), float(f[3]), float(f[4])))
        except ValueError:
            print(f"clocks.csv line {n}: not a sample: {line.strip()[:80]}", file=sys.stderr)
    by = {}
    for name, v in json.load(open(sys.argv[2]))["configs"].items():
        w = v.get("window_unix_s")
        if not w or None in w:
            continue
        by.setdefault(name.partition("@")[0], []).extend(s for s in samples if w[0] <= s[0] <= w[1])
    if not any(by.values()):
        print("no sample falls in any run's window: was the log taken during this call, and is "
              "TZ the same as where nvidia-smi ran?", file=sys.stderr)
    print(f"{'config':44} {'samples':>7} {'sm p10':>7} {'sm p50':>7} {'sm p90':>7} {'power W':>8} {'util %':>7}")
    for name, ss in by.items():
        if not ss:
            print(f"{name:44} {0:7}")
            continue
        sm = sorted(s[1] for s in ss)
        q = lambda p: sm[min(len(sm) - 1, round(p * (len(sm) - 1)))]  # noqa: E731
        print(f"{name:44} {len(ss):7} {q(0.1):7.0f} {q(0.5):7.0f} {q(0.9):7.0f} "
              f"{statistics.fmean(s[3] for s in ss):8.0f} {statistics.fmean(s[4] for s in ss):7.0f}")


if __name__ == "__main__":
    main()
