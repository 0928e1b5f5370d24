"""Media off the training thread: ``log_image`` / ``log_video`` / ``log_audio`` / ``log_text``.

The caller's part is a copy of what it passed (an array of pixels, frames or samples, a path or
a string) into a bounded queue; the *media* thread encodes it (PNG, animated GIF, 16-bit WAV,
UTF-8), keeps the bytes in the media store (``schemas.MediaStore``, content-addressed under the
data directory) and only then hands the run a Media event carrying the reference, so an event
never names bytes that are not kept. Kafka never carries the bytes.

Bounded: at most ``max_items`` items and ``max_bytes`` of copies wait; past either the item is
shed, counted (``run.stats()["media_dropped"]``) and said once, as events are. A store that
refuses an item (too large, full) or a disk that fails counts it in ``media_refused`` and says
so once: scalar logging goes on whatever happens here.
"""

from __future__ import annotations

import collections
import io
import logging
import threading
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metricbus.schemas import MEDIA_TYPES, MediaRefused, MediaStore, ref_of

log = logging.getLogger("metricbus.producer")

#: longest text sample kept (characters); a longer one is cut there and says so at its end
MAX_TEXT_CHARS = 1_000_000


def _array(data: Any) -> Any:
    """``data`` as a numpy array the caller can no longer change (a torch tensor: on the host)."""
    import numpy as np

    if hasattr(data, "detach"):
        data = data.detach().cpu().numpy()
    return np.array(data, copy=True)


def _pixels(arr: Any, what: str) -> Any:
    """An image array as HxWxC uint8 (C 1, 3 or 4): CHW is made HWC, floats in [0, 1] scaled."""
    import numpy as np

    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3:
        raise ValueError(f"{what}: an image is HxW, HxWxC or CxHxW (got shape {arr.shape})")
    if arr.shape[-1] not in (1, 3, 4) and arr.shape[0] in (1, 3, 4):
        arr = np.moveaxis(arr, 0, -1)  # torch's CxHxW
    if arr.shape[-1] not in (1, 3, 4):
        raise ValueError(f"{what}: an image has 1, 3 or 4 channels (got shape {arr.shape})")
    if arr.dtype != np.uint8:
        values = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
        if values.size and values.max() > 1.0:  # 0-255 as floats or ints
            arr = np.clip(values, 0, 255).astype(np.uint8)
        else:
            arr = (np.clip(values, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
    return arr


def _image(arr: Any) -> Any:
    from PIL import Image

    return Image.fromarray(arr[:, :, 0] if arr.shape[-1] == 1 else arr)


def encode_image(data: Any, what: str) -> tuple[bytes, dict[str, Any]]:
    """PNG bytes and the Media fields of an array, a PIL image or a file.

    A matplotlib figure arrives here as the PIL image :func:`copy_for_later` rendered it to.
    """
    from PIL import Image

    if isinstance(data, (str, Path)):
        with Image.open(data) as opened:
            opened.load()
            data = opened.convert("RGBA" if "A" in opened.getbands() else "RGB")
    if isinstance(data, Image.Image):
        if data.mode not in ("L", "RGB", "RGBA"):
            data = data.convert("RGBA" if "A" in data.getbands() else "RGB")
        image = data
    else:
        image = _image(_pixels(data, what))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[image.mode]
    return buf.getvalue(), {"width": image.width, "height": image.height, "channels": channels}


def encode_video(frames: Any, fps: float, what: str) -> tuple[bytes, dict[str, Any]]:
    """An animated GIF of frames (TxHxWxC or TxCxHxW; TensorBoard's NxTxCxHxW: the first video)."""
    if isinstance(frames, (str, Path)):
        path = Path(frames)
        if path.suffix.lower() != ".gif":
            raise ValueError(f"{what}: a video file must be a GIF (got {path.name}); pass its frames instead")
        from PIL import Image

        data = path.read_bytes()
        with Image.open(io.BytesIO(data)) as gif:
            n = getattr(gif, "n_frames", 1)
            meta = {"width": gif.width, "height": gif.height, "channels": 3, "frames": n}
            meta["rate"] = 1000.0 / gif.info["duration"] if gif.info.get("duration") else float(fps)
        return data, meta
    if frames.ndim == 5:
        frames = frames[0]
    if frames.ndim == 3:  # TxHxW: grey
        frames = frames[..., None]
    if frames.ndim != 4 or len(frames) == 0:
        raise ValueError(f"{what}: a video is TxHxWxC or TxCxHxW frames (got shape {frames.shape})")
    if fps <= 0:
        raise ValueError(f"{what}: fps must be positive (got {fps})")
    images = [_image(_pixels(f, what)) for f in frames]
    first = images[0]
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[first.mode]
    meta = {"width": first.width, "height": first.height, "channels": channels, "frames": len(images)}
    meta["rate"] = float(fps)
    if first.mode != "L":  # a palette per frame: Pillow's default quantizer took 1.3 s for 150 84x84
        # frames (~9 ms each, holding the GIL), the fast octree 0.05 s, as close to the frames
        from PIL import Image

        images = [i.quantize(method=Image.Quantize.FASTOCTREE) for i in images]
    buf = io.BytesIO()
    duration = max(20, round(1000 / fps))  # GIF delays are in 10 ms; browsers treat < 20 as 100
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0)
    return buf.getvalue(), meta


def encode_audio(samples: Any, rate: int, what: str) -> tuple[bytes, dict[str, Any]]:
    """16-bit PCM WAV of samples (L, LxC, or CxL with C < L; floats in [-1, 1] or int16)."""
    import numpy as np

    if isinstance(samples, (str, Path)):
        data = Path(samples).read_bytes()
        with wave.open(io.BytesIO(data)) as w:
            meta = {"rate": float(w.getframerate()), "channels": w.getnchannels(), "frames": w.getnframes()}
        return data, meta
    arr = samples
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"{what}: audio is L or LxC samples (got shape {arr.shape})")
    if arr.shape[0] < arr.shape[1]:  # CxL, TensorBoard's (1, L)
        arr = arr.T
    if int(rate) <= 0:
        raise ValueError(f"{what}: the sample rate must be positive (got {rate})")
    if arr.dtype != np.int16:
        values = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
        arr = (np.clip(values, -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(arr.shape[1])
        w.setsampwidth(2)
        w.setframerate(int(rate))
        w.writeframes(np.ascontiguousarray(arr, dtype="<i2").tobytes())
    return buf.getvalue(), {"rate": float(int(rate)), "channels": arr.shape[1], "frames": arr.shape[0]}


def encode_text(text: Any) -> tuple[bytes, dict[str, Any]]:
    """UTF-8 of a text sample (at most MAX_TEXT_CHARS characters)."""
    text = str(text)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + f"\n[... cut at {MAX_TEXT_CHARS:,} characters]"
    return text.encode("utf-8", "replace"), {}


def size_of(data: Any) -> int:
    """The bytes an array or tensor holds (0 for anything else), known without copying it."""
    if hasattr(data, "element_size") and hasattr(data, "nelement"):  # torch
        return int(data.element_size() * data.nelement())
    return int(getattr(data, "nbytes", 0) or 0)


def copy_for_later(kind: str, data: Any) -> tuple[Any, int]:
    """What the caller hands the media thread (a copy it can no longer change), and its size."""
    if isinstance(data, (str, Path)) and kind != "text":
        return Path(data), 0
    if kind == "text":
        return str(data), len(data) if isinstance(data, str) else 0
    if kind == "image" and (hasattr(data, "savefig") or hasattr(data, "getbands")):
        if hasattr(data, "savefig"):  # a figure: render now, the caller may draw on it next
            buf = io.BytesIO()
            data.savefig(buf, format="png")
            from PIL import Image

            data = Image.open(io.BytesIO(buf.getvalue()))
        return data.copy(), data.width * data.height * 4
    arr = _array(data)
    return arr, arr.nbytes


class MediaWriter:
    """The media thread of one run: encode, keep in the store, then emit the Media event."""

    def __init__(
        self,
        store: MediaStore,
        emit: Callable[[dict[str, Any]], None],
        failed: Callable[[str, BaseException], None],
        max_items: int = 256,
        max_bytes: int = 256 * 2**20,
    ) -> None:
        self.store = store
        self._emit = emit
        self._failed = failed
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._queue: collections.deque[tuple[dict[str, Any], Any, int, float]] = collections.deque()
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._busy = False
        self._stopping = False
        self.logged = 0  #: items kept and their events emitted
        self.dropped = 0  #: shed, the queue full
        self.refused = 0  #: refused by the store (bounds) or its disk
        self._said: set[str] = set()
        self._thread: threading.Thread | None = None

    def has_room(self, name: str, nbytes: int) -> bool:
        """Whether an item of ``nbytes`` fits the queue now; if not it is shed, counted and said.

        Asked before the caller copies it: an array past the bound is never copied.
        """
        with self._cond:
            if len(self._queue) < self.max_items and self._queued_bytes + nbytes <= self.max_bytes:
                return True
            self.dropped += 1
            self._say(
                "dropped",
                f"media {name!r} dropped: {len(self._queue)} items ({self._queued_bytes:,} bytes) wait "
                f"to be encoded, at most {self.max_items} ({self.max_bytes:,} bytes); later drops are "
                "counted in run.stats()['media_dropped']",
            )
            return False

    def submit(self, fields: dict[str, Any], data: Any, nbytes: int, rate: float = 0.0) -> None:
        """Queue an item (the caller's part): shed and counted when the queue is full."""
        if not self.has_room(fields["name"], nbytes):
            return
        with self._cond:
            self._queue.append((fields, data, nbytes, rate))
            self._queued_bytes += nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="metricbus-media", daemon=True)
                self._thread.start()
            self._cond.notify()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued item is kept and emitted (or ``timeout``); True if so."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def stop(self, timeout: float) -> None:
        """Drain, then end the thread."""
        self.drain(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if not self._queue:
                    return
                fields, data, nbytes, rate = self._queue.popleft()
                self._busy = True
            try:
                self._keep(fields, data, rate)
            finally:
                with self._cond:
                    self._queued_bytes -= nbytes
                    self._busy = False
                    self._cond.notify_all()

    def _keep(self, fields: dict[str, Any], data: Any, rate: float) -> None:
        kind, name = fields["kind"], fields["name"]
        what = f"media {name!r}"
        try:
            if kind == "image":
                raw, meta = encode_image(data, what)
            elif kind == "video":
                raw, meta = encode_video(data, rate, what)
            elif kind == "audio":
                raw, meta = encode_audio(data, int(rate), what)
            else:
                raw, meta = encode_text(data)
        except Exception as exc:  # noqa: BLE001 - a bad item is said and skipped, never raised
            self._failed(f"log_{kind}", exc)
            return
        try:
            digest = self.store.put(raw)
        except (MediaRefused, OSError) as exc:
            self.refused += 1
            self._say(
                "refused", f"{what} not kept: {exc}; later ones are counted in stats()['media_refused']"
            )
            return
        body = {
            **fields,
            "media_type": MEDIA_TYPES[kind],
            "size": len(raw),
            "digest": digest,
            "ref": ref_of(digest),
            "width": 0,
            "height": 0,
            "frames": 0,
            "rate": 0.0,
            "channels": 0,
            **meta,
        }
        self.logged += 1
        self._emit(body)

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("%s", message)
