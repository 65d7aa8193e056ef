#!/usr/bin/env python3
"""Render a moefleet Grafana dashboard from a lab's Prometheus into a PNG, for the docs (no Grafana needed).

    python3 sim/lab/render_dashboard.py PROMETHEUS_URL OUT.png [--dashboard moefleet-fleet.json] [--minutes 15]

Each timeseries panel's queries are run as range queries ($__rate_interval: 1m) and drawn in the dashboard's
order; stat panels show their instant values; tables list their series' labels. Test and demo equipment: product
code never imports it.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

DASHBOARDS = Path(__file__).resolve().parents[2] / "roles" / "monitoring_server" / "files" / "dashboards"


def query(base: str, path: str, **params) -> list:
    with urllib.request.urlopen(f"{base}{path}?{urllib.parse.urlencode(params)}", timeout=30) as resp:
        return json.load(resp)["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out or ",".join(f"{k}={v}" for k, v in labels.items() if k != "__name__")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("prometheus")
    parser.add_argument("out", type=Path)
    parser.add_argument("--dashboard", default="moefleet-fleet.json")
    parser.add_argument("--minutes", type=int, default=15)
    parser.add_argument("--host", default="")
    args = parser.parse_args()
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    board = json.loads((DASHBOARDS / args.dashboard).read_text())
    panels = board["panels"]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 2.9))
    end = time.time()
    start = end - args.minutes * 60
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel["title"], fontsize=9)
        ax.tick_params(labelsize=7)
        texts = []
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$host", args.host)
            if panel["type"] == "timeseries":
                for series in query(args.prometheus, "/api/v1/query_range", query=expr, start=start, end=end, step=15):
                    xs = [(float(t) - end) / 60 for t, _ in series["values"]]
                    ys = [float(v) for _, v in series["values"]]
                    ax.plot(xs, ys, label=legend(target.get("legendFormat", ""), series["metric"]), linewidth=1)
            else:
                for series in query(args.prometheus, "/api/v1/query", query=expr):
                    name = legend(target.get("legendFormat", ""), series["metric"])
                    if panel["type"] == "stat":
                        texts.append(f"{name}: {float(series['value'][1]):g}")
                    else:
                        labels = series["metric"]
                        texts.append(" ".join(f"{k}={labels[k]}" for k in ("host", "asked_profile", "serving_profile",
                                                                           "outcome") if k in labels))
        if panel["type"] == "timeseries":
            ax.set_xlabel("minutes", fontsize=7)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6, loc="upper left")
        else:
            ax.axis("off")
            ax.text(0.0, 0.9, "\n".join(texts[:8]) or "(no data)", va="top", fontsize=8, family="monospace",
                    transform=ax.transAxes, wrap=True)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{board['title']} (the lab's Prometheus, last {args.minutes} min)", fontsize=11)
    fig.subplots_adjust(left=0.05, right=0.98, top=0.94, bottom=0.05, hspace=0.55, wspace=0.25)
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
