"""Signed records: an HMAC-SHA256 over each events record, when the project sets a key.

A signed record is ``MBS1`` + 32-byte HMAC-SHA256(key, inner) + inner, the inner bytes an
unchanged Avro single-object record (``_codec``). Producers sign what they encode; the stream
worker, every sink and the dashboard check each record of the events topic before decoding it:
with a key set, an unsigned record or one whose HMAC does not match is refused
(:class:`ForgedSignatureError`, dead-lettered by the consumers), so a forged copy is never taken
and cannot displace the genuine one, whichever arrives first. Retries, the spool, ``metricbus
sync`` and a planned broker restart move the same bytes, signature included.

Without a key nothing is signed nor checked (docs: shared clusters). The codec reads both forms
(:func:`inner`), so the archive and replays never need the key.
"""

from __future__ import annotations

import hashlib
import hmac

from ._errors import ForgedSignatureError

SIGNED = b"MBS1"
#: What signing adds to a record: the marker and the HMAC.
SIGNATURE_BYTES = len(SIGNED) + hashlib.sha256().digest_size


def inner(value: bytes) -> bytes:
    """The record without its signature (``value`` itself when it has none)."""
    return value[SIGNATURE_BYTES:] if value[: len(SIGNED)] == SIGNED else value


class Signer:
    """Signs and checks records with one key (``Settings.signing_key``); None: does neither."""

    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None

    @property
    def active(self) -> bool:
        """A key is set: records are signed and checked."""
        return self._key is not None

    def _mac(self, data: bytes) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, data, hashlib.sha256).digest()

    def sign(self, value: bytes) -> bytes:
        """``value`` signed (unchanged without a key)."""
        return value if self._key is None else SIGNED + self._mac(value) + value

    def check(self, value: bytes) -> None:
        """Raise ForgedSignatureError unless ``value`` carries this key's HMAC (no key: pass)."""
        if self._key is None:
            return
        if value[: len(SIGNED)] != SIGNED or len(value) < SIGNATURE_BYTES:
            raise ForgedSignatureError(
                "an unsigned record where the project signs its records (METRICBUS_SIGNING_KEY): "
                "written by someone without the key, or by a producer not given it"
            )
        if not hmac.compare_digest(value[len(SIGNED) : SIGNATURE_BYTES], self._mac(value[SIGNATURE_BYTES:])):
            raise ForgedSignatureError(
                "the record's HMAC does not match the project's key (METRICBUS_SIGNING_KEY): "
                "forged, corrupted, or signed with another key"
            )
