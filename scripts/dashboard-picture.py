#!/usr/bin/env python3
"""Draws the panels of a Grafana dashboard from a Prometheus, without Grafana.

    dashboard-picture.py --prometheus http://127.0.0.1:9090 --start T0 --end T1 \\
        --dashboard deploy/grafana/quotad.json --out docs/img/dashboard.png

Runs each panel's own queries (variables: job and instance match anything
given by --job and --instance, $__rate_interval is --rate-interval) over
[start, end] and draws the panels where the dashboard's gridPos puts them:
time series as lines, stat panels as their last value. A panel whose
queries return nothing says "No data", as Grafana does.
Used by scripts/dashboard-picture.sh.
"""

import argparse
import json
import math
import re
import urllib.parse
import urllib.request
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

BACKGROUND = "#111217"
PANEL = "#181b1f"
BORDER = "#2c3235"
TEXT = "#ccccdc"
MUTED = "#8e8e9e"
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9",
           "#8ab8ff", "#fade2a", "#96d98d", "#ffb357", "#ff7383", "#ca95e5"]
GRID_COLUMNS = 24


def query_range(base, expr, start, end, step):
    params = urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": step}
    )
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"query failed: {expr}: {body}")
    return body["data"]["result"]


def substitute(expr, args):
    expr = expr.replace("$__rate_interval", args.rate_interval)
    expr = re.sub(r"\$\{?job\}?", args.job, expr)
    return re.sub(r"\$\{?instance\}?", args.instance, expr)


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def format_value(value, unit):
    if value is None or math.isnan(value):
        return "No data"
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "s":
        if value < 1e-3:
            return f"{value * 1e6:.0f} µs"
        if value < 1:
            return f"{value * 1e3:.1f} ms"
        return f"{value:.2f} s"
    suffix = {"reqps": " req/s", "ops": " ops/s"}.get(unit, "")
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k{suffix}"
    return f"{value:.3g}{suffix}"


def panel_axes(fig, panel, rows, plot):
    """The panel's box where gridPos puts it, its title, and axes inside it
    with room for tick labels when `plot`."""
    width_px, height_px = fig.get_size_inches() * fig.dpi
    header_px, gap_px = 36, 6
    unit_w = (width_px - gap_px) / GRID_COLUMNS
    unit_h = (height_px - header_px - gap_px) / rows
    grid = panel["gridPos"]
    left = grid["x"] * unit_w + gap_px
    top = header_px + grid["y"] * unit_h + gap_px
    box_w = grid["w"] * unit_w - gap_px
    box_h = grid["h"] * unit_h - gap_px
    fig.add_artist(matplotlib.patches.Rectangle(
        (left / width_px, 1 - (top + box_h) / height_px), box_w / width_px, box_h / height_px,
        transform=fig.transFigure, facecolor=PANEL, edgecolor=BORDER, linewidth=1, zorder=-1))
    fig.text((left + 8) / width_px, 1 - (top + 6) / height_px, panel["title"], color=TEXT,
             fontsize=10, fontweight="bold", va="top")
    inner = (54, 22, 12, 30) if plot else (8, 8, 8, 28)  # left, bottom, right, top
    return fig.add_axes([
        (left + inner[0]) / width_px,
        1 - (top + box_h - inner[1]) / height_px,
        (box_w - inner[0] - inner[2]) / width_px,
        (box_h - inner[1] - inner[3]) / height_px,
    ])


def frame(ax):
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)


def draw_stat(ax, panel, series_by_target, unit):
    frame(ax)
    ax.set_xticks([])
    ax.set_yticks([])
    text_mode = panel.get("options", {}).get("textMode")
    lines = []
    for fmt, series in series_by_target:
        for s in series:
            value = float(s["values"][-1][1]) if s["values"] else float("nan")
            if text_mode == "name":
                lines.append(legend(fmt, s["metric"]))
            else:
                lines.append(format_value(value, unit))
    if not lines:
        ax.text(0.5, 0.45, "No data", color=MUTED, fontsize=14, ha="center", va="center",
                transform=ax.transAxes)
        return
    size = 24 if len(lines) == 1 else 13
    ax.text(0.5, 0.45, "\n".join(lines[:4]), color=PALETTE[0], fontsize=size,
            ha="center", va="center", transform=ax.transAxes, fontweight="bold")


def draw_timeseries(ax, panel, series_by_target, unit):
    frame(ax)
    ax.tick_params(colors=MUTED, labelsize=7)
    ax.grid(color=BORDER, linewidth=0.6)
    drawn = 0
    for fmt, series in series_by_target:
        for s in series:
            times = [datetime.fromtimestamp(float(t), tz=timezone.utc) for t, _ in s["values"]]
            values = [float(v) for _, v in s["values"]]
            if unit == "percentunit":
                values = [v * 100 for v in values]
            elif unit == "s":
                values = [v * 1e3 for v in values]
            ax.plot(times, values, color=PALETTE[drawn % len(PALETTE)], linewidth=1.2,
                    label=legend(fmt, s["metric"]))
            drawn += 1
    if drawn == 0:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "No data", color=MUTED, fontsize=12, ha="center", va="center",
                transform=ax.transAxes)
        return
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.set_ylim(bottom=0)
    label = {"reqps": "req/s", "percentunit": "%", "s": "ms", "ops": "ops/s"}.get(unit)
    if label:
        ax.set_ylabel(label, color=MUTED, fontsize=7)
    legend_box = ax.legend(loc="upper left", fontsize=6, ncol=2 if drawn > 4 else 1,
                           frameon=True, facecolor=PANEL, edgecolor=BORDER, labelcolor=TEXT)
    legend_box.set_alpha(0.85)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--end", type=float, required=True)
    parser.add_argument("--step", default="1")
    parser.add_argument("--job", default=".*")
    parser.add_argument("--instance", default=".*")
    parser.add_argument("--rate-interval", default="10s")
    parser.add_argument("--caption", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dashboard = json.load(open(args.dashboard))
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows * 0.3 + 0.4), dpi=100, facecolor=BACKGROUND)
    fig.text(0.006, 1 - 10 / fig.bbox.height, f"{dashboard['title']}  ·  {args.caption}",
             color=TEXT, fontsize=12, va="top")
    for panel in panels:
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        series_by_target = [
            (t.get("legendFormat", ""),
             query_range(args.prometheus, substitute(t["expr"], args), args.start, args.end,
                         args.step))
            for t in panel.get("targets", [])
        ]
        ax = panel_axes(fig, panel, rows, plot=panel["type"] != "stat")
        if panel["type"] == "stat":
            draw_stat(ax, panel, series_by_target, unit)
        else:
            draw_timeseries(ax, panel, series_by_target, unit)
    fig.savefig(args.out, facecolor=BACKGROUND)
    print(f"wrote {args.out} ({len(panels)} panels)")


if __name__ == "__main__":
    main()
