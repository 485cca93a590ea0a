#!/usr/bin/env python3
"""Bar charts of an openmla-bench JSON file: the fraction of the speed-of-light ceiling that
each case reaches, one PNG per op (PREFIX_<op>.png) and one of every case (PREFIX_summary.png).

    python3 bench/plot.py RESULTS.json PREFIX

A memory-bound case is judged against the copy ceiling; a case that counts FLOPs also against
the GEMM ceiling of its input type (fp8 for fp8 inputs, bf16 otherwise). Needs matplotlib.
"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def known(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def gemm_fraction(result):
    """The fraction of the GEMM ceiling of the case's input type, or None without FLOPs."""
    if not known(result.get("tflops")):
        return None
    key = "frac_fp8_gemm" if result["dtype"].startswith("fp8") else "frac_bf16_gemm"
    return result.get(key) if known(result.get(key)) else None


def label(result):
    return f"{result['case']}\n{result['dtype']}"


def title(data, what):
    ceilings = data["ceilings"]

    def number(key, unit):
        value = ceilings.get(key)
        return f"{value:.0f} {unit}" if known(value) else "n/a"

    return (f"{what}: {data['gpu']}, commit {data['commit']}, {data['date']}\n"
            f"ceilings: copy {number('copy_gbps', 'GB/s')}, "
            f"bf16 GEMM {number('bf16_gemm_tflops', 'TFLOPS')}, "
            f"fp8 GEMM {number('fp8_gemm_tflops', 'TFLOPS')}")


def bar_chart(path, heading, labels, series):
    """series: [(name, [fraction or None per label])]; None draws no bar."""
    width = 0.8 / len(series)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.3 * len(labels) + 2.0), 4.8))
    for index, (name, fractions) in enumerate(series):
        positions = [i + (index - (len(series) - 1) / 2) * width for i in range(len(labels))]
        heights = [f if f is not None else 0.0 for f in fractions]
        bars = axes.bar(positions, heights, width, label=name)
        for bar, fraction in zip(bars, fractions):
            if fraction is not None:
                axes.annotate(f"{fraction:.2f}", (bar.get_x() + bar.get_width() / 2, fraction),
                              ha="center", va="bottom", fontsize=7)
    axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(labels)))
    axes.set_xticklabels(labels, fontsize=7, rotation=20, ha="right")
    axes.set_ylabel("fraction of ceiling")
    top = max([1.0] + [f for _, fractions in series for f in fractions if f is not None])
    axes.set_ylim(0, 1.12 * top)
    axes.set_title(heading, fontsize=8)
    axes.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"wrote {path}")


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    json_path, prefix = argv[1], argv[2]
    with open(json_path) as file:
        data = json.load(file)
    results = data["results"]
    if not results:
        print(f"{json_path}: no results to plot", file=sys.stderr)
        return 1
    directory = os.path.dirname(prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)

    if not any(known(r.get("frac_copy")) or gemm_fraction(r) is not None for r in results):
        print(f"{json_path}: no ceiling fractions (a run without a GPU?): nothing to plot")
        return 0

    ops = []
    for result in results:
        if result["op"] not in ops:
            ops.append(result["op"])
    for op in ops:
        rows = [r for r in results if r["op"] == op]
        series = [("copy (memory)", [r.get("frac_copy") if known(r.get("frac_copy")) else None
                                     for r in rows])]
        gemm = [gemm_fraction(r) for r in rows]
        if any(f is not None for f in gemm):
            series.append(("GEMM (compute)", gemm))
        bar_chart(f"{prefix}_{op}.png", title(data, op), [label(r) for r in rows], series)

    # Summary: each case against the ceiling that binds it (the larger fraction).
    best = []
    for r in results:
        fractions = [f for f in (r.get("frac_copy"), gemm_fraction(r)) if known(f)]
        best.append(max(fractions) if fractions else None)
    bar_chart(f"{prefix}_summary.png", title(data, "all ops, binding ceiling"),
              [f"{r['op']}\n{label(r)}" for r in results], [("fraction of binding ceiling", best)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
