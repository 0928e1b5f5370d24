import subprocess
import sys

import metricbus
import producers
import schemas
import sinks


def test_public_surfaces_are_deliberate():
    assert set(metricbus.__all__) == {
        "init",
        "log",
        "finish",
        "Run",
        "Settings",
        "__version__",
        "MetricbusError",
        "ConfigError",
        "InvalidNameError",
        "SchemaError",
        "EncodeError",
        "MetricValueError",
        "BrokerError",
        "PortInUseError",
        "history",  # the archive as DataFrames (issue 12)
        "runs",
    }
    for module in (metricbus, producers, schemas, sinks):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_every_error_is_a_metricbus_error():
    for name in schemas.__all__:
        obj = getattr(schemas, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, schemas.MetricbusError), name


def test_importing_the_core_imports_no_optional_integration_and_no_kafka_client():
    code = (
        "import sys, metricbus; heavy = {'torch', 'wandb', 'tensorboard', 'faust', 'kafka', 'aiokafka', "
        "'gymnasium'} & set(sys.modules); print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_components_never_import_the_face():
    import ast
    import pathlib

    def imported(path):  # real imports only: docstrings may show how a user imports the face
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                yield from (a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield node.module.split(".")[0]

    root = pathlib.Path(__file__).resolve().parents[2]
    for package in ("schemas", "producers", "sinks", "stream_jobs"):
        for path in (root / package).rglob("*.py"):
            assert "metricbus" not in set(imported(path)), path
    for path in (root / "schemas").rglob("*.py"):
        assert not {"producers", "sinks", "stream_jobs"} & set(imported(path)), path
