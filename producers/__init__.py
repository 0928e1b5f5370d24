"""The producer hook: what runs inside the training process.

``Run.log`` only enqueues; a background thread batches, encodes, spools and publishes.
"""

from ._publisher import Publisher
from ._run import SDK_VERSION, Run
from ._spool import Spool, SpoolBusyError, pending_spools, spool_in_use, spooled_records, unsent_bytes
from ._summary_writer import SummaryWriter
from ._sync import SyncReport, sync_spools
from ._system import SystemSampler, sample_system
from ._transport import KafkaTransport, OfflineTransport, Transport, TransportError
from ._values import ValueGate
from ._wandb_api import Audio as WandbAudio
from ._wandb_api import Histogram as WandbHistogram
from ._wandb_api import Html as WandbHtml
from ._wandb_api import Image as WandbImage
from ._wandb_api import Table as WandbTable
from ._wandb_api import Video as WandbVideo
from ._wandb_api import WandbRun
from ._wandb_api import init as wandb_init

__all__ = [
    "SDK_VERSION",
    "KafkaTransport",
    "OfflineTransport",
    "Publisher",
    "Run",
    "Spool",
    "SpoolBusyError",
    "SyncReport",
    "SystemSampler",
    "Transport",
    "TransportError",
    "SummaryWriter",
    "ValueGate",
    "WandbAudio",
    "WandbHistogram",
    "WandbHtml",
    "WandbImage",
    "WandbVideo",
    "WandbRun",
    "WandbTable",
    "wandb_init",
    "pending_spools",
    "spool_in_use",
    "spooled_records",
    "unsent_bytes",
    "sample_system",
    "sync_spools",
]
