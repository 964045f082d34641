#!/usr/bin/env python3
"""Plots a soak run as SVG on stdout, with nothing but the standard library.

    python3 bench/soak/plot.py <samples.csv> <events.csv> > soak.svg

Three panels over the minutes of load: each node proxy's RSS (MiB), open descriptors and
CPU (% of one core, between consecutive samples of the same process); one line per
process, so a restart starts a new line; dashed verticals where a new proxy took over.
"""
import csv
import sys

W, PANEL_H, LEFT, RIGHT, TOP, GAP = 760, 150, 60, 20, 58, 46
COLORS = {"a": "#1f77b4", "b": "#d62728"}


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def nice_max(v):
    """A round number at or above v, for the axis."""
    if v <= 0:
        return 1
    step = 10 ** (len(str(int(v))) - 1)
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * step:
            return m * step
    return 10 * step


def main():
    rows = read(sys.argv[1])
    events = read(sys.argv[2]) if len(sys.argv) > 2 else []
    if not rows:
        sys.exit("no samples")
    t0 = float(rows[0]["t_s"])
    minutes = lambda r: (float(r["t_s"]) - t0) / 60
    span = max(minutes(rows[-1]), 1e-9)

    # Per node, per process: (minute, rss MiB, fds, cpu %).
    series = {}
    for node in "ab":
        prev = None
        for r in rows:
            pid = r[f"{node}_pid"]
            rss = int(r[f"{node}_rss_kib"])
            if rss == 0:
                continue
            cpu = None
            if prev and prev[f"{node}_pid"] == pid:
                dt = float(r["t_s"]) - float(prev["t_s"])
                if dt >= 2:
                    cpu = (float(r[f"{node}_cpu_s"]) - float(prev[f"{node}_cpu_s"])) / dt * 100
            series.setdefault((node, pid), []).append(
                (minutes(r), rss / 1024, int(r[f"{node}_fds"]), cpu)
            )
            prev = r

    panels = [("RSS (MiB)", 1), ("open descriptors", 2), ("CPU (% of a core)", 3)]
    height = TOP + len(panels) * (PANEL_H + GAP) + 10
    plot_w = W - LEFT - RIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    failed = sum(int(v) for k, v in rows[-1].items() if k.endswith("_failed"))
    served = sum(int(v) for k, v in rows[-1].items() if k.endswith("_ok"))
    retried = sum(int(v) for k, v in rows[-1].items() if k.endswith("_retried"))
    restarts = [e for e in events if e["event"] == "restart_ready"]
    out.append(
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">Ambit soak: '
        f"{span:.0f} min of load, {len(restarts)} hitless restarts</text>"
    )
    out.append(
        f'<text x="{LEFT}" y="32">{served:,} requests and streams served, {failed} failed '
        f"({retried} sent again after a closing connection gave them back unsent)</text>"
    )
    out.append(
        f'<text x="{LEFT}" y="47" fill="#555">node-a <tspan fill="{COLORS["a"]}">━━</tspan>'
        f'  node-b <tspan fill="{COLORS["b"]}">━━</tspan>  (a new line per proxy process; '
        f"dashed: a new proxy took over)</text>"
    )
    for i, (title, col) in enumerate(panels):
        y0 = TOP + i * (PANEL_H + GAP) + 14
        values = [p[col] for s in series.values() for p in s if p[col] is not None]
        top = nice_max(max(values) * 1.1 if values else 1)
        x = lambda m: LEFT + m / span * plot_w
        y = lambda v: y0 + PANEL_H - v / top * PANEL_H
        out.append(f'<text x="{LEFT}" y="{y0 - 4}" font-weight="bold">{title}</text>')
        out.append(
            f'<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL_H}" '
            'fill="none" stroke="#999"/>'
        )
        for frac in (0, 0.5, 1):
            v = top * frac
            out.append(
                f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>'
            )
            if 0 < frac < 1:
                out.append(
                    f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                    'stroke="#eee"/>'
                )
        step = 5 if span > 10 else 1
        m = 0
        while m <= span + 1e-9:
            out.append(
                f'<text x="{x(m):.1f}" y="{y0 + PANEL_H + 13}" text-anchor="middle">{m:g}</text>'
            )
            m += step
        for e in restarts:
            m = (float(e["t_s"]) - t0) / 60
            if 0 <= m <= span:
                node = "a" if "node-a" in e["detail"] else "b"
                out.append(
                    f'<line x1="{x(m):.1f}" x2="{x(m):.1f}" y1="{y0}" y2="{y0 + PANEL_H}" '
                    f'stroke="{COLORS[node]}" stroke-dasharray="3,3" opacity="0.6"/>'
                )
        for (node, _), pts in series.items():
            coords = " ".join(
                f"{x(p[0]):.1f},{y(p[col]):.1f}" for p in pts if p[col] is not None
            )
            if coords:
                out.append(
                    f'<polyline points="{coords}" fill="none" stroke="{COLORS[node]}" '
                    'stroke-width="1.3"/>'
                )
    out.append(
        f'<text x="{LEFT + plot_w / 2}" y="{height - 4}" text-anchor="middle">'
        "minutes of load</text>"
    )
    out.append("</svg>")
    print("\n".join(out))


if __name__ == "__main__":
    main()
