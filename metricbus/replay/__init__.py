"""Replay: archived runs (or a run's topics) written again, into a new sink or a Kafka cluster.

This room owns replay into any sink (``replay_to_sink``: the same sink code as live, idempotent
per output), republishing into another cluster's topics (``replay_to_kafka``) and the runs a
replay takes (``archived_runs``). It reads the Parquet archive, the durable record.
"""

from ._replay import archived_runs, events_from_kafka, replay_to_kafka, replay_to_sink

__all__ = ["archived_runs", "events_from_kafka", "replay_to_kafka", "replay_to_sink"]
