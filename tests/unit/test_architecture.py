"""The rooms and their arrows (DESIGN.md), held by tests rather than by memory.

- components (schemas, producers, stream_jobs, sinks) import only ``metricbus.schemas`` and
  themselves; ``schemas`` imports nothing of ours; none imports the face (``metricbus``);
- no sink imports another sink (the factory, beside them, builds them all);
- ops and diagnostics never import the supervisor (``metricbus.stack``);
- nothing imports a component by its bare folder name (``import schemas``): one installed name;
- no room imports a private module of the face's top level (``metricbus._history``): each
  mechanism lives in the room that owns it, and the face only re-exports;
- no product class has more than MAX_METHODS methods, no module more than MAX_LINES lines:
  past them one holds more than one idea, and is cut along its concerns;
- no circle of imports between files, counting those inside functions: the arrows go one way.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("schemas", "producers", "stream_jobs", "sinks")
ROOMS = ("cli", "stack", "ops", "diagnostics", "replay", "demo")
#: the sinks proper; the factory and the underscored helpers (runtime, archive reader, W&B
#: set-up) are shared plumbing of the sinks room
SINKS = ("parquet", "tensorboard", "wandb", "alerts")
MAX_METHODS = 20
MAX_LINES = 700


def module_name(path: Path) -> str:
    """``metricbus.<...>`` of a file in the repository (components through their links)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in COMPONENTS:
        parts.insert(0, "metricbus")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> Iterator[str]:
    """Absolute names of the modules a file imports (relative imports resolved; docstrings ignored)."""
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            yield mod
            yield from (f"{mod}.{alias.name}" for alias in node.names)


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def ours(name: str) -> bool:
    return name == "metricbus" or name.startswith("metricbus.")


def test_the_components_are_linked_into_the_one_installed_name():
    for component in COMPONENTS:
        link = ROOT / "metricbus" / component
        assert link.is_symlink() and link.resolve() == ROOT / component, link


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_component_imports_only_the_wire_contract_and_itself(component):
    allowed = {f"metricbus.{component}"} | ({"metricbus.schemas"} if component != "schemas" else set())
    for path in sources(component):
        for name in imports(path):
            if ours(name) and name != "metricbus":
                assert any(name == a or name.startswith(a + ".") for a in allowed), f"{path}: imports {name}"
            assert name != "metricbus", f"{path}: imports the face"


def test_no_sink_imports_another_sink():
    for sink in SINKS:
        path = ROOT / "sinks" / f"{sink}.py"
        others = {f"metricbus.sinks.{s}" for s in SINKS if s != sink}
        for name in imports(path):
            assert not any(name == o or name.startswith(o + ".") for o in others), f"{path}: imports {name}"


@pytest.mark.parametrize("room", ["ops", "diagnostics"])
def test_ops_and_diagnostics_never_import_the_supervisor(room):
    for path in sources(f"metricbus/{room}"):
        for name in imports(path):
            assert not name.startswith("metricbus.stack"), f"{path}: imports {name}"


def test_nothing_imports_a_component_by_its_bare_folder_name():
    for path in sources("metricbus", *COMPONENTS, "tests", "bench"):
        if "metricbus" in path.relative_to(ROOT).parts[:1] and path.relative_to(ROOT).parts[1] in COMPONENTS:
            continue  # the same files again, through the links
        for name in imports(path):
            assert name.split(".")[0] not in COMPONENTS, f"{path}: imports {name} (use metricbus.{name})"


def test_the_face_top_level_is_the_public_api_the_cli_and_the_rooms():
    top = {p.name for p in (ROOT / "metricbus").iterdir() if p.name not in ("__pycache__", "py.typed")}
    rooms = {p for p in top if (ROOT / "metricbus" / p / "__init__.py").exists()}
    assert rooms == set(ROOMS) | set(COMPONENTS), rooms
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((ROOT / "metricbus" / room / "__init__.py").read_text()))
        assert doc and "owns" in doc, f"metricbus/{room}: a docstring saying what the room owns"


def test_import_and_the_cli_work_beside_modules_of_the_generic_names(tmp_path):
    for name in COMPONENTS:
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s {name}.py was imported')\n")
    (tmp_path / "sinks").mkdir()
    (tmp_path / "sinks" / "__init__.py").write_text("raise ImportError('the user\\'s sinks/ was imported')\n")
    (tmp_path / "schemas.py").write_text("MAX_RECORD_BYTES = None\n")  # a user's module that half-fits
    data = str(tmp_path / "data")
    code = (
        "import metricbus, metricbus.sinks, metricbus.stream_jobs;"
        f"run = metricbus.init(project='p', settings=metricbus.Settings(data_dir={data!r}, bootstrap='127.0.0.1:9'));"
        "run.log({'Train/Loss': 1.0}, step=0); print(run.finish(timeout=2))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICBUS_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    cli = subprocess.run(
        [sys.executable, "-m", "metricbus", "--help"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert cli.returncode == 0 and "status" in cli.stdout, cli.stderr


def test_no_room_reaches_into_the_face_private_modules():
    private = {p.stem for p in (ROOT / "metricbus").glob("_*.py") if p.stem not in ("__init__", "__main__")}
    for room in (*ROOMS, *COMPONENTS):
        for path in sources(f"metricbus/{room}"):
            for name in imports(path):
                top = name.split(".")
                assert not (len(top) > 1 and top[0] == "metricbus" and top[1] in private), (
                    f"{path}: imports {name}"
                )


def test_no_product_class_has_over_20_methods_and_no_module_over_700_lines():
    face = [p for p in sources("metricbus") if p.relative_to(ROOT / "metricbus").parts[0] not in COMPONENTS]
    swollen = []
    for path in [*sources(*COMPONENTS), *face]:
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_LINES:
            swollen.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > MAX_METHODS:
                    swollen.append(f"{path.relative_to(ROOT)}: {node.name} has {len(methods)} methods")
    assert len(face) > 40 and not swollen, swollen  # (the face's files are found, not skipped)


def import_graph() -> dict[str, set[str]]:
    """Each product module -> the product modules it imports anywhere in it (a name imported
    from a package counts as its module when it is one, else as the package)."""
    files = {module_name(p): p for p in sources("metricbus", *COMPONENTS)}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    mod = ".".join([*base, node.module] if node.module else base)
                else:
                    mod = node.module or ""
                for alias in node.names:
                    if f"{mod}.{alias.name}" in files:
                        found.add(f"{mod}.{alias.name}")
                    elif mod in files:
                        found.add(mod)
        graph[name] = found - {name}
    return graph


def test_no_circle_of_imports_between_files():
    graph = import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the graph was read
    circles = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:  # depth first, the path so far on the stack
        for target in sorted(graph[module]):
            if target in path:
                circles.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert circles == []
