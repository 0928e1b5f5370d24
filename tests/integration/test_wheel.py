"""The package as a user installs it: a wheel built from this tree, in a fresh venv, outside the repo."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_module_and_installs_in_a_fresh_venv_where_the_core_imports(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, ROOT],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("metricbus-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    top_level = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"metricbus"}, top_level  # one installed name: nothing beside the user's modules
    for data in (
        "metricbus/schemas/avro/EventBatch.v2.avsc",
        "metricbus/stream_jobs/rules/default.yaml",
        "metricbus/ops/web/static/vendor/uplot/uPlot.iife.min.js",
        "metricbus/py.typed",
    ):
        assert any(n.endswith(data) for n in names), data
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    extras = {line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Provides-Extra")}
    assert {"torch", "tensorboard", "wandb", "web", "lightning", "sb3", "hf"} <= extras

    # A fresh venv whose third-party packages come from this venv's site-packages (no network
    # here), metricbus only from the wheel: the repo is not on its path. This venv's pip installs
    # into it (``pip --python``): the same install, without copying pip in first (~8 s).
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        check=True,
    )

    # The user's own modules of the generic names, where the user runs from: ours never see them.
    user = tmp_path / "user"
    user.mkdir()
    for name in ("schemas", "sinks", "producers", "stream_jobs"):
        (user / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    # Every module of the tree is in the wheel; the core imports from it. The framework
    # integrations are found there, not imported: importing them imports the frameworks
    # (transformers and Lightning: ~10 CPU-s each), and tests/integration/test_frameworks.py
    # runs them against the real frameworks from this tree, whose files these are.
    package = ROOT / "metricbus"  # producers/, schemas/, sinks/ and stream_jobs/ are links in it
    tree = {
        f"metricbus/{Path(top, f).relative_to(package)}"
        for top, _, files in os.walk(package, followlinks=True)
        for f in files
        if f.endswith(".py")
    }
    assert tree <= names, sorted(tree - names)
    probe = (
        "import importlib.resources as r, importlib.util as u, metricbus,"
        " metricbus.tensorboard, metricbus.wandb, metricbus.stream_jobs, metricbus.sinks;"
        "print(metricbus.__file__);"
        "print(r.files('metricbus.stream_jobs').joinpath('rules/default.yaml').read_text()[:1]);"
        "print(*(u.find_spec(m).origin for m in ('metricbus.sb3', 'metricbus.hf', 'metricbus.lightning',"
        " 'metricbus.producers.sb3', 'metricbus.producers.hf', 'metricbus.producers.lightning')))"
    )
    out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True, cwd=user)
    where, first, *integrations = out.stdout.split()
    assert Path(where).is_relative_to(env_dir) and first == "#", out.stdout
    assert len(integrations) == 6 and all(Path(i).is_relative_to(env_dir) for i in integrations), out.stdout
    help_text = subprocess.run(
        [env_dir / "bin" / "metricbus", "--help"], check=True, capture_output=True, text=True, cwd=user
    ).stdout
    assert "status" in help_text and "sink" in help_text
