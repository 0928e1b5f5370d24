"""Write ``tests/durations.json`` from a full run's JUnit report: each test of 3 s or more.

    .venv/bin/pytest -n 4 --dist worksteal --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.durations /tmp/suite.xml

The suite's conftest orders each xdist worker's share by these figures (longest first); a test
missing from the file counts as short, so the file only needs renewing when long tests change.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

LONG_S = 3.0


def main(report: str) -> None:
    durations = {}
    for case in ET.parse(report).iter("testcase"):
        seconds = float(case.get("time", 0))
        if seconds >= LONG_S:
            path = case.get("classname", "").replace(".", "/") + ".py"
            durations[f"{path}::{case.get('name')}"] = round(seconds)
    out = Path(__file__).parent / "durations.json"
    out.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n")
    print(f"{len(durations)} tests of {LONG_S:g} s or more -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
