"""``from metricbus.sb3 import MetricbusCallback`` (needs ``pip install 'metricbus[sb3]'``)."""

try:
    from metricbus.producers.sb3 import MetricbusCallback, MetricbusOutputFormat
except ImportError as exc:  # pragma: no cover - the message is the point
    if exc.name and exc.name.split(".")[0] in ("stable_baselines3", "gymnasium", "torch"):
        raise ImportError(
            "metricbus.sb3 needs Stable-Baselines3: pip install 'metricbus[sb3]'", name=exc.name
        ) from exc
    raise

__all__ = ["MetricbusCallback", "MetricbusOutputFormat"]
