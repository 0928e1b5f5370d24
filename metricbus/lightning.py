"""``from metricbus.lightning import MetricbusLogger`` (needs ``pip install 'metricbus[lightning]'``)."""

try:
    from metricbus.producers.lightning import MetricbusLogger
except ImportError as exc:  # pragma: no cover - the message is the point
    if exc.name and exc.name.split(".")[0] == "lightning":
        raise ImportError(
            "metricbus.lightning needs Lightning: pip install 'metricbus[lightning]'", name=exc.name
        ) from exc
    raise

__all__ = ["MetricbusLogger"]
