#!/usr/bin/env python3
"""Plots resourcewatch-scale's CSV (operator CPU and peak RSS against pods) as a PNG.

Usage: plot.py SCALE.csv OUT.png [LIMIT_MIB]
matplotlib (Debian's python3-matplotlib; `make scale` installs it).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no rows")
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else None
    pods = [int(r["pods"]) for r in rows]
    cpu = [float(r["cpu_percent"]) for r in rows]
    rss = [float(r["rss_peak_mib"]) for r in rows]
    p99 = [float(r["reconcile_p99_s"]) for r in rows]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 4))
    a.plot(pods, cpu, "o-")
    a.set(xlabel="pods", ylabel="% of a core", title="operator CPU")
    b.plot(pods, rss, "o-", label="peak RSS")
    if limit:
        b.axhline(limit, color="red", linestyle="--", label=f"limit {limit:.0f} MiB")
    b.set(xlabel="pods", ylabel="MiB", title="operator memory")
    b.legend()
    c.plot(pods, p99, "o-")
    c.axhline(2.0, color="red", linestyle="--", label="goal 2 s")
    c.set(xlabel="pods", ylabel="seconds (bucket bound)", title="reconcile p99")
    c.legend()
    for ax in (a, b, c):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
