import subprocess
import sys

import metricbus
from metricbus import producers, schemas, sinks


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
        "curves",  # a project's metric grouped by config, as the dashboard's Experiments page
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


def test_every_public_name_of_each_package_is_in_its_all_and_nothing_else_is():
    """As httpx pins its surface: a name that is public by its spelling (no underscore, not a
    submodule, not a re-export of another library) is in ``__all__``, and ``__all__`` names no
    more than the package holds."""
    import types

    from metricbus import ops, stream_jobs

    for module in (metricbus, producers, schemas, sinks, stream_jobs, ops):
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and not isinstance(value, types.ModuleType)
            and getattr(value, "__module__", module.__name__).startswith(("metricbus", module.__name__))
        }
        declared = set(module.__all__)
        assert public - declared == set(), f"{module.__name__}: public but not in __all__"
        # a name may be imported on first use (a module ``__getattr__``, as ``ops`` does)
        missing = {name for name in declared if not hasattr(module, name)}
        assert missing == set(), f"{module.__name__}: in __all__ but not there"


def test_the_status_command_imports_neither_asyncio_nor_pandas():
    """`status` answers cold: what only the long-running consumers use is imported where they
    start (asyncio alone is 50-90 ms of a status on a busy machine)."""
    code = "import sys, metricbus.cli, metricbus.ops._status; print(sorted({'asyncio', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
