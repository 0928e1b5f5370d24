"""The media store: the bytes of logged images, videos, audio and text, by content (the claim check).

A Media event on the events topic carries an item's name, step, media type, size, SHA-256 digest
and reference; the bytes are kept here, under the data directory, at
``<root>/sha256/<first two hex digits>/<digest>``: written atomically (whole or absent), once
per content (logging the same picture twice stores it once), never at a path made from anything
but a checked digest. Kafka never carries them. Readers (sinks, the dashboard, replay) ask for a
reference and get the bytes only if their digest and size are what the event says.

Bounds: an item of more than ``max_item_bytes`` and a store past ``max_bytes`` are refused with
:class:`MediaRefused`, which says which bound and how to raise it; the producer counts it and its
scalars go on. ``local`` is the one implementation today; an object store would implement
``put`` / ``get`` / ``digests`` / ``remove`` the same way.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import MetricbusError
from ._files import atomic_write

if TYPE_CHECKING:
    from ._settings import Settings

#: what a producer encodes each kind of media to, the only types readers accept
MEDIA_TYPES = {
    "image": "image/png",
    "video": "image/gif",  # an animated GIF: what TensorBoard's image dashboard plays, and W&B
    "audio": "audio/wav",
    "text": "text/plain; charset=utf-8",
}
#: largest item the store takes, by default (a 5 s 84x84 episode video is ~0.5 MB as a GIF)
MAX_ITEM_BYTES = 32 * 2**20
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class MediaRefused(MetricbusError):
    """An item the store will not keep: too large, or the store is full."""


class MediaMissing(MetricbusError):
    """A reference whose bytes are not in the store, or are not what its digest says."""


def digest_of(data: bytes) -> str:
    """The SHA-256 of ``data``, 64 lowercase hex digits: the item's identity."""
    return hashlib.sha256(data).hexdigest()


def ref_of(digest: str) -> str:
    """The reference a Media event carries for the item of ``digest``."""
    return f"sha256/{digest}"


def checked_digest(ref: str) -> str:
    """The digest a reference names; MediaMissing unless it is ``sha256/<64 hex digits>``.

    A reference comes from a topic (untrusted): it is never used as a path, only its digest is.
    """
    if not isinstance(ref, str) or not ref.startswith("sha256/") or not _DIGEST.match(ref[7:]):
        raise MediaMissing(f"media reference {ref[:80]!r} is not sha256/<64 hex digits>")
    return ref[7:]


class MediaStore:
    """A content-addressed store of media bytes in one directory (see the module docstring)."""

    def __init__(self, root: Path, max_bytes: int = 10 * 2**30, max_item_bytes: int = MAX_ITEM_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_item_bytes = max_item_bytes
        self._used: int | None = None  # bytes in the store, counted once then kept up to date

    @classmethod
    def of(cls, settings: Settings) -> MediaStore:
        """The store of a data directory (``<data dir>/media``), with the settings' size bound."""
        return cls(settings.media_root, max_bytes=int(settings.media_max_mb * 2**20))

    def path(self, digest: str) -> Path:
        """Where the bytes of ``digest`` are kept (the digest checked first)."""
        if not _DIGEST.match(digest):
            raise MediaMissing(f"{digest[:80]!r} is not a SHA-256 digest")
        return self.root / "sha256" / digest[:2] / digest

    def put(self, data: bytes) -> str:
        """Keep ``data``; its digest. MediaRefused past a bound; OSError from the disk."""
        size = len(data)
        if size > self.max_item_bytes:
            raise MediaRefused(
                f"a media item of {size:,} bytes is over the {self.max_item_bytes:,}-byte limit of one item"
            )
        digest = digest_of(data)
        path = self.path(digest)
        if path.exists():
            return digest
        if self.used_bytes() + size > self.max_bytes:
            raise MediaRefused(
                f"the media store {self.root} holds {self._used:,} bytes, its limit is {self.max_bytes:,}: "
                "raise METRICBUS_MEDIA_MAX_MB or run `metricbus gc`"
            )
        atomic_write(path, data)
        self._used = (self._used or 0) + size
        return digest

    def get(self, ref: str, size: int | None = None) -> bytes:
        """The bytes a reference names, verified; MediaMissing if absent, or not what it names."""
        digest = checked_digest(ref)
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            raise MediaMissing(f"media {ref} is not in the store {self.root}") from None
        if (size is not None and len(data) != size) or digest_of(data) != digest:
            raise MediaMissing(f"media {ref} in {self.root} does not match its digest (corrupted)")
        return data

    def digests(self) -> Iterator[str]:
        """The digests of every item kept."""
        top = self.root / "sha256"
        if not top.is_dir():
            return
        for sub in sorted(top.iterdir()):
            if sub.is_dir():
                for entry in sorted(sub.iterdir()):
                    if _DIGEST.match(entry.name) and entry.is_file():
                        yield entry.name

    def remove(self, digest: str) -> int:
        """Delete one item; the bytes freed (0 if it was not there)."""
        path = self.path(digest)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        if self._used is not None:
            self._used = max(0, self._used - size)
        return size

    def used_bytes(self) -> int:
        """Bytes the store holds (counted from the disk on the first call)."""
        if self._used is None:
            total = 0
            for digest in self.digests():
                try:
                    total += os.stat(self.path(digest)).st_size
                except FileNotFoundError:
                    continue
            self._used = total
        return self._used


def checked_media_type(body: dict[str, object]) -> None:
    """ValueError unless a Media event's kind and media type are a pair metricbus writes.

    Readers serve the bytes with that type (a browser, TensorBoard's plugins): a topic's
    ``text/html`` would be a page the dashboard serves from its own origin.
    """
    kind, media_type = body.get("kind"), body.get("media_type")
    if not isinstance(kind, str) or MEDIA_TYPES.get(kind) != media_type:
        raise ValueError(
            f"media of kind {kind!r:.40} and type {media_type!r:.60} is not one metricbus writes"
        )
