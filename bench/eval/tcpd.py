"""Score ``failslow.detectors.changepoint.find_change_points`` at its production defaults on TCPD.

The 25 local univariate series of ``../shared/datasets/tcpd`` (the paper's exclusions apply),
metrics as TCPDBench computes them (F1 with margin 5, segmentation cover), compared with the
published default scores averaged over the same 25 series (Table B of published_results.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.eval.tcpd_metrics import cover, f1
from failslow.detectors.changepoint import find_change_points

SERIES = [
    "bank",
    "brent_spot",
    "businv",
    "centralia",
    "children_per_woman",
    "co2_canada",
    "construction",
    "debt_ireland",
    "gdp_argentina",
    "gdp_croatia",
    "gdp_iran",
    "gdp_japan",
    "global_co2",
    "homeruns",
    "jfk_passengers",
    "lga_passengers",
    "nile",
    "ozone",
    "rail_lines",
    "seatbelts",
    "shanghai_license",
    "unemployment_nl",
    "us_population",
    "usd_isk",
    "well_log",
]


def load(root: Path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, list[int]]]]:
    data = {}
    for name in SERIES:
        d = json.loads((root / "datasets" / f"{name}.json").read_text())
        if d["n_dim"] != 1:
            raise ValueError(f"{name} is not univariate")
        data[name] = np.array(
            [np.nan if v is None else v for v in d["series"][0]["raw"]], dtype=np.float64
        )
    return data, json.loads((root / "annotations.json").read_text())


def published_table(root: Path) -> dict[str, tuple[float, float]]:
    """Mean published default (F1, cover) per method over the same series; failures count 0."""
    pf1 = json.loads((root / "published" / "scores" / "default_f1_scores.json").read_text())
    pcv = json.loads((root / "published" / "scores" / "default_cover_scores.json").read_text())
    methods = sorted(pf1[SERIES[0]])
    return {
        m: (
            float(np.mean([pf1[s].get(m) or 0.0 for s in SERIES])),
            float(np.mean([pcv[s].get(m) or 0.0 for s in SERIES])),
        )
        for m in methods
    }


def run(root: Path) -> dict[str, Any]:
    data, annotations = load(root)
    per_series = {}
    started = time.perf_counter()
    for name, x in data.items():
        cps = find_change_points(x)
        per_series[name] = {
            "n": int(x.size),
            "change_points": cps,
            "f1": f1(annotations[name], cps, x.size),
            "cover": cover(annotations[name], cps, x.size),
        }
    ours = (
        float(np.mean([r["f1"] for r in per_series.values()])),
        float(np.mean([r["cover"] for r in per_series.values()])),
    )
    table = published_table(root)
    return {
        "series": len(per_series),
        "seconds": round(time.perf_counter() - started, 2),
        "failslow": {"f1": round(ours[0], 3), "cover": round(ours[1], 3)},
        "published_default": {
            m: {"f1": round(a, 3), "cover": round(b, 3)} for m, (a, b) in table.items()
        },
        "best_published_f1": max(table.items(), key=lambda kv: kv[1][0])[0],
        "best_published_cover": max(table.items(), key=lambda kv: kv[1][1])[0],
        "beats_every_published_default": ours[0] > max(a for a, _ in table.values())
        and ours[1] > max(b for _, b in table.values()),
        "per_series": per_series,
    }


def render(result: dict[str, Any]) -> str:
    rows = [f"{'method':10s} {'F1':>6s} {'cover':>6s}"]
    rows.append(
        f"{'failslow':10s} {result['failslow']['f1']:6.3f} {result['failslow']['cover']:6.3f}"
    )
    for m, s in sorted(result["published_default"].items(), key=lambda kv: -kv[1]["f1"]):
        rows.append(f"{m:10s} {s['f1']:6.3f} {s['cover']:6.3f}")
    return "\n".join(rows)
