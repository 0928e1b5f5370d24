"""Avro single-object encoding: ``C3 01`` + 8-byte CRC-64-AVRO fingerprint + Avro binary.

Encoding always uses the newest version of a schema. Decoding looks the writer schema up by
fingerprint among every version ever released and resolves it to the newest reader schema,
so bytes written by any older producer still read.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

from ._errors import (
    BadMagicError,
    EncodeError,
    SchemaError,
    TruncatedRecordError,
    UnknownSchemaError,
)
from ._registry import SCHEMA_DIR, SchemaVersion, load_versions
from ._signing import inner

MAGIC = b"\xc3\x01"
HEADER_SIZE = 10


class Codec:
    """Encode and decode every record type in ``schemas/avro``. Thread-safe (no mutable state)."""

    def __init__(self, directory: Path = SCHEMA_DIR) -> None:
        self.versions = load_versions(directory)
        self._by_fingerprint: dict[bytes, tuple[SchemaVersion, SchemaVersion]] = {}
        for versions in self.versions.values():
            newest = versions[-1]
            for version in versions:
                self._by_fingerprint[version.fingerprint] = (version, newest)

    def newest(self, name: str) -> SchemaVersion:
        """The newest version of the record ``name`` (e.g. "EventBatch")."""
        try:
            return self.versions[name][-1]
        except KeyError:
            raise SchemaError(
                f"no schema named {name!r} in {SCHEMA_DIR}; known: {sorted(self.versions)}"
            ) from None

    def encode(self, name: str, datum: Any, version: int | None = None) -> bytes:
        """Encode ``datum`` with the newest (or the given) version of schema ``name``.

        Raises EncodeError, naming the schema, when a field has the wrong type.
        """
        schema = self.newest(name)
        if version is not None:
            matches = [v for v in self.versions[name] if v.version == version]
            if not matches:
                raise SchemaError(f"{name} has no version {version}")
            schema = matches[0]
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(schema.fingerprint)
        try:
            schemaless_writer(buf, schema.parsed, datum)
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
            raise EncodeError(f"cannot encode a {name} v{schema.version}: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes) -> tuple[str, Any]:
        """Return ``(schema name, datum)``, the datum shaped by the newest reader schema.

        Union branches of records come back as ``(full record name, dict)`` tuples.
        A signed record (``_signing``) is read as its inner record: checking the signature is
        the consumers' (``Signer.check``), before they decode.
        Raises BadMagicError, UnknownSchemaError or TruncatedRecordError.
        """
        data = inner(data)
        if len(data) < HEADER_SIZE:
            raise TruncatedRecordError(
                f"record is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header"
            )
        if data[:2] != MAGIC:
            raise BadMagicError(
                f"record starts with {bytes(data[:2]).hex()}, not c301: it was not written by "
                "metricbus (Avro single-object encoding)"
            )
        fingerprint = bytes(data[2:HEADER_SIZE])
        try:
            writer, reader = self._by_fingerprint[fingerprint]
        except KeyError:
            raise UnknownSchemaError(
                f"writer fingerprint {fingerprint.hex()} is not in schemas/avro; the record was "
                "written by a newer metricbus: upgrade this consumer"
            ) from None
        stream = io.BytesIO(data)
        stream.seek(HEADER_SIZE)
        try:
            datum = schemaless_reader(
                stream,
                writer.parsed,
                None if writer is reader else reader.parsed,
                return_record_name=True,
            )
        except (EOFError, StopIteration, IndexError) as exc:
            raise TruncatedRecordError(
                f"{writer.name} v{writer.version} record ends early ({len(data)} bytes)"
            ) from exc
        except (ValueError, UnicodeDecodeError, TypeError, OverflowError, MemoryError) as exc:
            raise SchemaError(f"corrupt {writer.name} v{writer.version} record: {exc}") from exc
        if stream.tell() != len(data):
            raise SchemaError(
                f"{writer.name} v{writer.version} record has {len(data) - stream.tell()} "
                "bytes after its end: corrupt or mis-framed"
            )
        return writer.name, datum


_default: Codec | None = None


def default_codec() -> Codec:
    """The process-wide codec over ``schemas/avro`` (built on first use)."""
    global _default
    if _default is None:
        _default = Codec()
    return _default
