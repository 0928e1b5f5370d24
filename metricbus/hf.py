"""``from metricbus.hf import MetricbusCallback`` (needs ``pip install 'metricbus[hf]'``)."""

try:
    from metricbus.producers.hf import MetricbusCallback
except ImportError as exc:  # pragma: no cover - the message is the point
    if exc.name and exc.name.split(".")[0] in ("transformers", "torch"):
        raise ImportError(
            "metricbus.hf needs transformers: pip install 'metricbus[hf]'", name=exc.name
        ) from exc
    raise

__all__ = ["MetricbusCallback"]
