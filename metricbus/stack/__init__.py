"""``metricbus up``: the local stack, supervised.

This room owns the embedded Kafka-protocol broker (``_broker``: Tansu, memory-only), the
supervisor that starts the topics and every consumer process and stops them in order
(``_supervisor``), the consumer processes it supervises (``_children``), child processes that
die with their parent (``_proc``), and the planned broker restart that bounds the broker's
memory (``_planned_restart``: the protocol, step by step, and who does each), carrying what
consumers have not read to a fresh broker (``_restart``). Nothing outside the CLI and the demo
starts a stack.
"""

from ._broker import EmbeddedBroker, port_free
from ._supervisor import Stack, available_consumers

__all__ = ["EmbeddedBroker", "Stack", "available_consumers", "port_free"]
