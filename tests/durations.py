"""Write ``tests/durations.json`` from full runs' JUnit reports: each test of 3 s or more.

    .venv/bin/pytest -n 4 --dist worksteal --junitxml=/tmp/suite1.xml   # and again, a few times
    .venv/bin/python -m tests.durations /tmp/suite1.xml /tmp/suite2.xml ...

Each test's figure is its median over the reports that hold it (one run on a loaded 2-core
machine is noisy). The suite's conftest orders each xdist worker's share by these figures
(longest first); a test missing from the file counts as short, so the file only needs renewing
when long tests change.
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

LONG_S = 3.0


def main(reports: list[str]) -> None:
    seen: dict[str, list[float]] = {}
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            path = case.get("classname", "").replace(".", "/") + ".py"
            seen.setdefault(f"{path}::{case.get('name')}", []).append(float(case.get("time", 0)))
    durations = {
        test: round(statistics.median(times))
        for test, times in seen.items()
        if statistics.median(times) >= LONG_S
    }
    out = Path(__file__).parent / "durations.json"
    out.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")
    print(f"{len(durations)} tests of {LONG_S:g} s or more (medians of {len(reports)} runs) -> {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
