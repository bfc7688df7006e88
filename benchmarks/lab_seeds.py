"""Merge one-seed runs of `charlm lab copy|recall|forgetting|width --seed S --json` into the table and reading that
`--seeds K` would print (the same records: every seed's value, the mean and the lowest), so the seeds can
run as separate processes and each finished seed counts. What benchmarks/RESULTS.md ("Lab") quotes for
the 10-seed figures.

    for s in 0 1 2; do charlm lab recall --seed $s --json --out runs > recall-s$s.json; done
    python benchmarks/lab_seeds.py recall-s*.json            # drawn as --plain draws it
    python benchmarks/lab_seeds.py recall-s*.json --json     # the merged result
"""

import argparse
import json
import statistics

from rich.console import Console

from charlm.lab import copy, forgetting, recall, width
from charlm.lab.result import LabResult, record, spread
from charlm.views.lab import render_lab

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("files", nargs="+")
ap.add_argument("--json", action="store_true")
a = ap.parse_args()

runs = sorted((json.load(open(f)) for f in a.files), key=lambda r: r["settings"]["seeds"][0])
first = runs[0]


def show(result: LabResult) -> None:
    if a.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        render_lab(Console(width=110, color_system=None), result, color=False)


if first["experiment"] in ("forgetting", "width"):  # their records are made from every seed's raw scores
    seeds = [r["settings"]["seeds"][0] for r in runs]
    settings = {**first["settings"], "seeds": seeds}
    if first["experiment"] == "forgetting":
        raw = [row for r in runs for row in r["details"]["per_seed"]]
        records = forgetting.summarise(raw, settings)
        reading = forgetting.reading(records, settings, seeds)
    else:  # each seed's record of a model and size holds its own score, steps and CPU-seconds: joined in seed order
        task = settings.get("task", "recall")
        size = width.SWEEPS[task].size
        rows: dict = {}
        for r in (rec for run in runs for rec in run["results"]):
            rows.setdefault((r["model"], r["width"], r[size]), []).append(r)
        records = []
        for each in rows.values():
            every = [v for r in each for v in r["per_seed"]]
            records.append(
                {
                    **each[0],
                    "accuracy": round(statistics.fmean(every), 4),
                    "lowest": min(every),
                    "per_seed": every,
                    "steps_per_seed": [n for r in each for n in r["steps_per_seed"]],
                    "capped": sum(r["capped"] for r in each),
                    "cpu_seconds": round(statistics.fmean(r["cpu_seconds"] for r in each), 4),
                }
            )
        settings["widths"] = {k: tuple(v) for k, v in settings["widths"].items()}
        reading = width.reading(records, settings, seeds, task)
    chart = forgetting.CHART if first["experiment"] == "forgetting" else width.SWEEPS[task].chart
    show(
        LabResult(
            first["experiment"],
            settings,
            records,
            reading,
            chart,
            runs=[run for r in runs for run in r["runs"]],
            seconds=sum(r["seconds"] for r in runs),
        )
    )
    raise SystemExit(0)
name, key = first["experiment"], {"copy": "length", "recall": "pairs"}[first["experiment"]]
seeds = [r["settings"]["seeds"][0] for r in runs]
records = []
for i, r0 in enumerate(first["results"]):
    values = [run["results"][i]["accuracy"] for run in runs]
    assert all(run["results"][i][key] == r0[key] and run["results"][i]["model"] == r0["model"] for run in runs)
    s = spread(values)
    ordered = {}
    for k, v in r0.items():  # the one-seed record's columns, in its order, with every seed's values
        if k == "params" and len(values) > 1:
            ordered |= {"lowest": s["lowest"], "per_seed": s["per_seed"]}
        if k == "accuracy":
            v = s["accuracy"]
        elif k in ("train_seconds", "cpu_seconds", "steps", "shown"):
            v = statistics.fmean(run["results"][i][k] for run in runs)
        elif k == "shown_lowest":
            v = min(run["results"][i][k] for run in runs)
        elif k == "steps_per_seed":
            v = [n for run in runs for n in run["results"][i][k]]
        ordered[k] = v
    records.append(record(**ordered))
settings = {**first["settings"], "seeds": seeds}
if name == "recall":
    reading, chart = recall.reading(records, settings, seeds), recall.CHART
else:
    reading, chart = copy.reading(records, first["details"], settings, seeds), copy.CHART
result = LabResult(
    name,
    settings,
    records,
    reading,
    chart,
    runs=[run for r in runs for run in r["runs"]],
    seconds=sum(r["seconds"] for r in runs),
    details=first["details"],
)
show(result)
