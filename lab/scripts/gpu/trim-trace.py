"""A record-mode trace cut to a size the repo can ship: its last N launches (`--end-at-gap`:
the N launches up to the last GPU idle gap over 1 ms, so that a service's trace ends with a
whole request and leaves out a tail where it fell behind), with each
kernel's mangled name replaced by a short one (k0, k1, ... in order of first launch; the
simulator tells kernels apart by name, grid and block, so nothing it uses changes).

  python3 lab/scripts/gpu/trim-trace.py IN.csv OUT.csv --launches N [--end-at-gap]
"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--launches", type=int, required=True)
    ap.add_argument("--end-at-gap", action="store_true")
    a = ap.parse_args()
    with open(a.trace, newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    k = header.index("kernel")
    end = len(rows)
    if a.end_at_gap:
        start, stop = header.index("start_ns"), header.index("end_ns")
        gaps = [i + 1 for i in range(len(rows) - 1)
                if int(rows[i + 1][start]) - int(rows[i][stop]) > 1_000_000]
        if not gaps:
            raise SystemExit(f"{a.trace}: the GPU never idled over 1 ms; no request ends")
        end = gaps[-1]
    names = {}
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for r in rows[max(0, end - a.launches):end]:
            r[k] = names.setdefault(r[k], f"k{len(names)}")
            w.writerow(r)


if __name__ == "__main__":
    main()
