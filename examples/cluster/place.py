#!/usr/bin/env python3
"""A scheduler-side placement loop over several mmk nodes, using nothing but Fit.

For each job of a trace, in order, it asks every node `mmkctl fit` (AllocationService.Fit)
and submits the job to the best node:

  1. a node that takes it now, then one that takes it after a reconfiguration, then one
     where it would wait, never one where it can never fit;
  2. among those, the smallest predicted cost to the jobs already on the node;
  3. then the largest gain in predicted system throughput;
  4. then the node with the fewest jobs waiting (spreads the queue);
  5. then the node listed first.

This is what a cluster scheduler's node-scoring plugin would do with the same calls
(docs/cluster.md). It prints one JSON array: per job, the node (its index in --node order),
the job ID there, the verdict and the cost.

Trace format (CSV with a header): name,class,gpu_memory,workload[,duration]
"""

import argparse
import csv
import json
import os
import subprocess
import sys

RANK = {"now": 0, "after-reconfiguration": 1, "wait": 2}


def mmkctl(args, socket, *cmd):
    out = subprocess.run(
        [args.mmkctl, "--socket", socket, "--output", "json", *cmd],
        capture_output=True,
        text=True,
    )
    return out.returncode, out.stdout, out.stderr


def fit(args, socket, cls, job_file):
    code, out, err = mmkctl(args, socket, "fit", f"--{cls}", job_file)
    # 0: fits (now or after a reconfiguration), 3: would wait, 4: never fits here.
    if code not in (0, 3, 4):
        sys.exit(f"place.py: fit on {socket} failed: {err.strip()}")
    return json.loads(out)


def queued(args, socket):
    code, out, err = mmkctl(args, socket, "capacity")
    if code != 0:
        sys.exit(f"place.py: capacity on {socket} failed: {err.strip()}")
    return json.loads(out)["queued_jobs"]


def job_yaml(row):
    duration = row.get("duration") or "10h"
    return (
        f"name: {row['name']}\n"
        f"gpu_memory: {row['gpu_memory']}\n"
        f"workload:\n  name: {row['workload']}\n  duration: {duration}\n"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--node", action="append", required=True, help="an mmkd socket")
    p.add_argument("--trace", required=True)
    p.add_argument("--mmkctl", default="mmkctl")
    p.add_argument("--workdir", default=".", help="where the job files are written")
    args = p.parse_args()

    placed = []
    with open(args.trace, newline="") as f:
        rows = list(csv.DictReader(f))
    for line, row in enumerate(rows, start=2):
        cls = row.get("class", "")
        if cls not in ("online", "offline"):
            sys.exit(f"place.py: {args.trace} line {line}: class: {cls!r} is not online or offline")
        path = os.path.join(args.workdir, f"{row['name']}.yaml")
        with open(path, "w") as jf:
            jf.write(job_yaml(row))
        best = None
        for i, socket in enumerate(args.node):
            v = fit(args, socket, cls, path)
            if v["verdict"] not in RANK:
                continue
            gain = (v.get("stp_after") or 0.0) - (v.get("stp_before") or 0.0)
            key = (RANK[v["verdict"]], v.get("cost") or 0.0, -gain, queued(args, socket), i)
            if best is None or key < best[0]:
                best = (key, i, v)
        if best is None:
            sys.exit(f"place.py: {row['name']} fits on no node")
        _, i, v = best
        code, out, err = mmkctl(args, args.node[i], "submit", f"--{cls}", path)
        if code != 0:
            sys.exit(f"place.py: submit {row['name']} to {args.node[i]} failed: {err.strip()}")
        job = json.loads(out)
        placed.append(
            {
                "name": row["name"],
                "node": i,
                "job": job["id"],
                "verdict": v["verdict"],
                "cost": v.get("cost"),
            }
        )
        print(
            f"{row['name']}: node {i} ({v['verdict']}, cost {v.get('cost') or 0:.3f})",
            file=sys.stderr,
        )
    json.dump(placed, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
