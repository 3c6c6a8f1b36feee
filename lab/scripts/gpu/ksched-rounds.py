"""Summarizes a rounds run of the co-location benchmark (lab/scripts/gpu/ksched-rounds.sh).

  python3 lab/scripts/gpu/ksched-rounds.py rounds.json [rounds.json ...]

A configuration's runs are NAME (round 1) and NAME@R (round R). Several files (calls made
one after another) are pooled: a round is then round R of one file, and its runs are
compared with that file's round R. Latency: every request of every round pooled, p50 and
p99 against the ideal runs of the same rounds pooled; and per round, the p99 against
that round's ideal run (lowest..highest). Training: steps per second against the same
round's plain-MPS run (mean, lowest..highest); for a synthetic training ("-trainspinN",
"-traincopyN"), against "mps" with the same suffix. Where the service timed its GPU work
(SERVE_GPU_TIME=1), a second table splits each request's latency into the wait before its
work started on the GPU (queueing behind the previous request included) and the GPU time
of the work, pooled (p50, p99), and gives what each adds over the ideal runs of the same
rounds (p50, us).
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module  # noqa: E402

colocate = import_module("ksched-colocate")
pct, train_suffix = colocate.pct, colocate.train_suffix


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ksched-rounds.py rounds.json [rounds.json ...]")
    by = {}
    for call, path in enumerate(sys.argv[1:]):
        for name, v in json.load(open(path))["configs"].items():
            base, _, r = name.partition("@")
            if not (r or "1").isdigit():
                print(f"skipping {name} of {path}: not a round (NAME or NAME@R)", file=sys.stderr)
                continue
            by.setdefault(base, {})[(call, int(r or 1))] = v
    ideal = by.get("ideal", {})
    pooled_ideal = [x for v in ideal.values() for x in v.get("latencies_ms", [])]
    if not pooled_ideal:
        sys.exit("no ideal runs with latencies")
    i50, i99 = pct(pooled_ideal, 50), pct(pooled_ideal, 99)
    print(f"ideal pooled: {len(pooled_ideal)} requests, p50 {i50:.2f} ms, p99 {i99:.2f} ms; "
          f"per round p99 " + " / ".join(f"{v['p99_ms']:.2f}" for _, v in sorted(ideal.items())))
    print(f"{'config':28} {'runs':>4} {'requests':>8} {'p50':>7} {'p99':>7} {'p50/ideal':>9} "
          f"{'p99/ideal':>9} {'round p99/ideal':>17} {'train/mps':>21}")
    for base, rs in by.items():
        lat = [x for v in rs.values() for x in v.get("latencies_ms", [])]
        if not lat:
            continue
        p50, p99 = pct(lat, 50), pct(lat, 99)
        # Against the ideal runs of the rounds this configuration ran in, not of every file.
        own = [x for r in rs if r in ideal for x in ideal[r].get("latencies_ms", [])] or pooled_ideal
        i50, i99 = pct(own, 50), pct(own, 99)
        per = [v["p99_ms"] / ideal[r]["p99_ms"] for r, v in rs.items() if r in ideal]
        mps = by.get("mps" + train_suffix(base), {})
        tr = [v["train_steps_per_s"] / mps[r]["train_steps_per_s"]
              for r, v in rs.items() if "train_steps_per_s" in v and r in mps]
        train = (f"{statistics.fmean(tr):5.2f} ({min(tr):.2f}..{max(tr):.2f})" if tr else "-")
        rounds = f"{min(per):8.2f}..{max(per):.2f}" if per else "-"
        print(f"{base:28} {len(rs):4} {len(lat):8} {p50:7.2f} {p99:7.2f} {p50 / i50:9.2f} "
              f"{p99 / i99:9.2f} {rounds:>17} {train:>21}")
    def split_of(runs):
        """(waits, GPU times) of every request of these runs, in ms."""
        pairs = [(x, g) for v in runs for x, g in zip(v.get("latencies_ms", []), v.get("gpu_ms", []))]
        return [x - g for x, g in pairs], [g for _, g in pairs]

    if split_of(ideal.values())[1]:
        print("\nper request: wait = from arrival to the start of its GPU work (queueing behind the "
              "previous request included); gpu = its GPU work (CUDA events); +us = p50 over the ideal "
              "runs' of the same rounds")
        print(f"{'config':28} {'wait p50':>9} {'wait p99':>9} {'gpu p50':>8} {'gpu p99':>8} "
              f"{'wait +us':>9} {'gpu +us':>8}")
        for base, rs in by.items():
            wait, gpu = split_of(rs.values())
            own_w, own_g = split_of(ideal[r] for r in rs if r in ideal)
            if not gpu or not own_g:
                continue
            w0, g0 = pct(own_w, 50), pct(own_g, 50)
            w50, g50 = pct(wait, 50), pct(gpu, 50)
            print(f"{base:28} {w50:9.3f} {pct(wait, 99):9.3f} {g50:8.3f} {pct(gpu, 99):8.3f} "
                  f"{(w50 - w0) * 1e3:9.0f} {(g50 - g0) * 1e3:8.0f}")


if __name__ == "__main__":
    main()
