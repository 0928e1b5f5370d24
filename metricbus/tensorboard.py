"""``from metricbus.tensorboard import SummaryWriter``: torch's SummaryWriter, publishing to metricbus.

See :class:`producers.SummaryWriter` for what carries over (scalars, scalar groups, histograms,
text, hparams) and what is said once and counted (images, audio, graphs, ...).
"""

from metricbus.producers import SummaryWriter

__all__ = ["SummaryWriter"]
