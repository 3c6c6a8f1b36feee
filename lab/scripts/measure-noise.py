"""How much two measurements of the same configuration differ (docs/measure.md, "Noise").

  python3 lab/scripts/measure-noise.py FIRST.jsonl SECOND.jsonl

Both are `mmk-lab measure` outputs with alone runs; compares the iteration time of every
(workload, batch, share) measured in both, and the normalized performance (time alone at
100 % / time at the share) of every share below 100 measured in both with its 100 % run.
"""
import json
import statistics
import sys


def load(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r["kind"] == "run" and r["mode"] == "alone":
            j = r["jobs"][0]
            out[(j["workload"], j["batch"], j["share_pct"])] = j["mean_s"]
    return out


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    both = sorted(set(a) & set(b))
    time = [abs(b[k] / a[k] - 1) for k in both]
    perf = []
    for w, batch, s in both:
        ref = (w, batch, 100)
        if s < 100 and ref in a and ref in b:
            perf.append(abs((b[ref] / b[(w, batch, s)]) / (a[ref] / a[(w, batch, s)]) - 1))
    print(f"iteration time: {len(time)} configurations, mean difference "
          f"{100 * statistics.mean(time):.1f} %, median {100 * statistics.median(time):.1f} %, "
          f"max {100 * max(time):.1f} %")
    if perf:
        print(f"normalized performance: {len(perf)} configurations, mean difference "
              f"{100 * statistics.mean(perf):.1f} %, median {100 * statistics.median(perf):.1f} %, "
              f"max {100 * max(perf):.1f} %")
    worst = sorted(((abs(b[k] / a[k] - 1), k) for k in both), reverse=True)[:5]
    print("largest:", ", ".join(f"{w}-b{bt} @ {s} %: {100 * d:.0f} %" for d, (w, bt, s) in worst))


if __name__ == "__main__":
    main()
