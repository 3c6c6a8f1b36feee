"""MMK's mean average JCT, makespan, STP and SLO misses per case and rate, side by side for
the build before the crowd cap and for each folder given, with the best of Default, MISO
and MIGER (from the build before; the cap changes only MMK). A `*` marks a loss of more
than 0.5 % against that best.

  python3 compare.py [CASES] DIR...    CASES: comma-separated (default: every case found)

Each DIR holds CASE.json files (`mmkctl simulate ... --output json`, made by
../2026-11-26-vm-generalization/run.sh with OUT=DIR, and paper.json / small.json by the
commands in README.md)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.join(HERE, "..", "2026-11-26-vm-generalization")
sys.path.insert(0, GEN)
from summarize import ALL_CASES, means  # noqa: E402

CASES = ALL_CASES + ["paper", "small"]
BEFORE = {c: os.path.join(GEN, f"{c}.json") for c in ALL_CASES}
BEFORE["paper"] = os.path.join(GEN, "variants", "paper-base.json")
BEFORE["small"] = os.path.join(GEN, "variants", "small-base.json")


def load(path):
    return means(json.load(open(path))) if os.path.exists(path) else None


def main():
    args = sys.argv[1:]
    cases = CASES
    if args and not os.path.isdir(args[0]):
        cases = args.pop(0).split(",")
    dirs = [(os.path.basename(os.path.normpath(d)), d) for d in args]
    for case in cases:
        before = load(BEFORE[case])
        if before is None:
            continue
        cols = [("before", before)] + [(n, load(os.path.join(d, f"{case}.json"))) for n, d in dirs]
        print(f"\n{case}: MMK avg JCT / makespan / STP / SLO miss %; best baseline's first")
        for iv in sorted({k[0] for k in before}):
            base = [before[(iv, b)] for b in ("default", "miso", "miger") if (iv, b) in before]
            jct = min(b["avg_jct_s"] for b in base)
            mk = min(b["makespan_s"] for b in base)
            stp = max(b["stp"] for b in base)
            row = f"{iv:>5g} s | best {jct:7.0f} {mk:7.0f} {stp:.3f} |"
            for name, m in cols:
                r = m and m.get((iv, "mmk"))
                if not r:
                    continue
                lose_mk = "*" if r["makespan_s"] > mk * 1.005 else " "
                lose_stp = "*" if r["stp"] < stp * 0.995 else " "
                lose_jct = "*" if r["avg_jct_s"] > jct * 1.005 else " "
                row += (f" {name} {r['avg_jct_s']:7.0f}{lose_jct} {r['makespan_s']:7.0f}{lose_mk}"
                        f" {r['stp']:.3f}{lose_stp} {r['slo_miss_pct']:4.1f} |")
            print(row)


if __name__ == "__main__":
    main()
