"""Pools the runs of one or more default-path.py calls by configuration: the service's
latencies over every round (p50, p95, p99, mean, and each round's p99), the training's
steps/s (mean over the rounds, and against plain MPS's), and the shares and profiles the
runs were planned with. Calls on different machines should be pooled apart. Percentiles
are linearly interpolated (numpy's default), so they can differ by a few tenths of a ms
from the nearest-rank figures in default-path.json's own per-run `summary`.

  python3 lab/scripts/gpu/default-path-pool.py CALL.json [CALL.json ...] [--markdown]
"""
import argparse
import json
import statistics


def pct(xs, p):
    """The p-th percentile, linearly interpolated (numpy's default)."""
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def pool(paths):
    lat, steps, planned = {}, {}, {}
    for path in paths:
        for name, r in json.load(open(path))["configs"].items():
            base = name.split("@")[0]
            parts = ([(f"{base}:first", r["first"]), (f"{base}:second", r["second"])]
                     if "first" in r else [(base, r)])
            for key, x in parts:
                if x.get("latencies_ms"):
                    lat.setdefault(key, []).append(x["latencies_ms"])
                if x.get("train_steps_per_s"):
                    steps.setdefault(key, []).append(x["train_steps_per_s"])
                a = x.get("assignment")
                if a:
                    p = x.get("planned_as") or {}
                    planned.setdefault(key, set()).add(
                        (a["online"]["mps_share"], a["offline"]["mps_share"],
                         (p.get("online") or "").split(" (")[0],
                         (p.get("offline") or "").split(" (")[0]))
    mps = statistics.fmean(steps["mps"]) if "mps" in steps else None
    out = {}
    for key in sorted(set(lat) | set(steps)):
        rounds = lat.get(key, [])
        every = [v for r in rounds for v in r]
        row = {"rounds": max(len(rounds), len(steps.get(key, [])))}
        if every:
            row |= {"p50_ms": pct(every, 50), "p95_ms": pct(every, 95),
                    "p99_ms": pct(every, 99), "mean_ms": statistics.fmean(every),
                    "p99_by_round_ms": [round(pct(r, 99), 1) for r in rounds]}
        if key in steps:
            row["train_steps_per_s"] = statistics.fmean(steps[key])
            if mps:
                row["train_vs_mps"] = row["train_steps_per_s"] / mps
        row["planned"] = sorted(planned.get(key, []))
        out[key] = row
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("calls", nargs="+")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    rows = pool(a.calls)
    if not a.markdown:
        print(json.dumps(rows, indent=1))
        return
    print("| configuration | rounds | shares (online / offline), planned as | service p50 / p95 / p99 / mean (ms) | p99 by round | training vs plain MPS |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, r in rows.items():
        shares = "; ".join(f"{on} / {off} ({pon or '-'}, {poff or '-'})"
                           for on, off, pon, poff in r["planned"])
        lat = (f"{r['p50_ms']:.1f} / {r['p95_ms']:.1f} / {r['p99_ms']:.1f} / {r['mean_ms']:.1f}"
               if "p50_ms" in r else "")
        by = ", ".join(f"{v:g}" for v in r.get("p99_by_round_ms", []))
        train = ""
        if "train_steps_per_s" in r:
            train = f"{r['train_steps_per_s']:.1f} steps/s"
            if "train_vs_mps" in r:
                train += f" ({100 * r['train_vs_mps']:.0f} %)"
        print(f"| {key} | {r['rounds']} | {shares} | {lat} | {by} | {train} |")


if __name__ == "__main__":
    main()
