"""Every schema version kept in ``schemas/avro/``, indexed by CRC-64-AVRO fingerprint.

File names are ``<Record>.v<N>.avsc``. Files are never edited once released: a change is
a new file with the next N, and readers resolve every older version to the newest one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from ._errors import ConfigError

SCHEMA_DIR = Path(__file__).parent / "avro"
_FILE = re.compile(r"^(?P<name>[A-Za-z]+)\.v(?P<version>\d+)\.avsc$")


@dataclasses.dataclass(frozen=True)
class SchemaVersion:
    """One released schema file."""

    name: str  #: file stem before the version, e.g. "EventBatch"
    version: int
    path: Path
    raw: dict[str, Any]  #: the JSON as written
    parsed: Any  #: fastavro's parsed form
    fingerprint: bytes  #: 8 bytes, little-endian, as in single-object encoding

    @property
    def canonical(self) -> str:
        """Avro's Parsing Canonical Form, what the fingerprint is taken of."""
        return str(to_parsing_canonical_form(self.raw))


def load_versions(directory: Path = SCHEMA_DIR) -> dict[str, list[SchemaVersion]]:
    """Read every ``*.avsc`` in ``directory``: {name: versions sorted oldest first}."""
    found: dict[str, list[SchemaVersion]] = {}
    for path in sorted(directory.glob("*.avsc")):
        match = _FILE.match(path.name)
        if match is None:
            raise ConfigError(
                f"schema file {path} is not named <Record>.v<N>.avsc; rename it so its version is known."
            )
        raw = json.loads(path.read_text())
        canonical = str(to_parsing_canonical_form(raw))
        found.setdefault(match["name"], []).append(
            SchemaVersion(
                name=match["name"],
                version=int(match["version"]),
                path=path,
                raw=raw,
                parsed=parse_schema(raw, _write_hint=False, _force=True),
                # fastavro's hex is the fingerprint's 8 little-endian bytes (single-object encoding)
                fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
            )
        )
    for versions in found.values():
        versions.sort(key=lambda v: v.version)
    return found
