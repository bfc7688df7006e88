"""Draw a saved `charlm lab NAME --json` result as `--plain` draws it (views.lab.render_lab), so a long run's
output can be shown without running it again. To merge one-seed copy or recall runs, benchmarks/lab_seeds.py.

    charlm lab capacity --json > capacity.json
    python benchmarks/lab_show.py capacity.json
"""

import argparse
import importlib
import json

from rich.console import Console

from charlm.lab.result import LabResult
from charlm.views.lab import render_lab

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("file")
ap.add_argument("--width", type=int, default=110)
a = ap.parse_args()

d = json.load(open(a.file))
module = importlib.import_module(f"charlm.lab.{d['experiment']}")
result = LabResult(
    d["experiment"], d["settings"], d["results"], d["reading"], module.CHART, d["runs"], d["seconds"], d["details"]
)
render_lab(Console(width=a.width, color_system=None), result, color=False)
