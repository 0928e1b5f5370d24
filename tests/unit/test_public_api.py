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
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    for package in ("schemas", "producers", "sinks", "stream_jobs"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            assert "import metricbus" not in text and "from metricbus" not in text, path
    for path in (root / "schemas").rglob("*.py"):
        text = path.read_text()
        for other in ("producers", "sinks", "stream_jobs"):
            assert f"from {other}" not in text and f"import {other}" not in text, path
