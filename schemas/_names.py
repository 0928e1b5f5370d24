"""Names that end up in paths and Kafka keys: validated at the edge, mapped deterministically."""

from __future__ import annotations

import re
import urllib.parse

from ._errors import InvalidNameError

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is safe as a directory name and a Kafka key, else raise.

    Run ids become directory names in the archive and the spool, so anything that could
    escape a directory (``/``, ``..``, a leading dot) or be ambiguous on disk is refused.
    """
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise InvalidNameError(
            f"run_id {run_id!r} is not usable: it must be 1-128 characters of letters, digits, "
            "'.', '_' or '-', starting with a letter or digit. Pass run_id=None to get a "
            "generated one."
        )
    return run_id


def path_segment(name: str) -> str:
    """Map any project or run name to one safe, reversible path segment (percent-encoding)."""
    quoted = urllib.parse.quote(name, safe=" -_,+@")
    if quoted in {"", ".", ".."}:
        quoted = quoted.replace(".", "%2E") or "%00"
    return quoted
