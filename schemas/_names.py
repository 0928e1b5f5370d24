"""Names that end up in paths, Kafka keys and terminals: validated at the edge, mapped deterministically."""

from __future__ import annotations

import hashlib
import re
import urllib.parse

from ._errors import InvalidNameError, UnsafeRecordError

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: the longest path segment made from a name: far under the 255 bytes of common filesystems
MAX_SEGMENT = 120
#: the project a sink files a run under before its RunStarted arrived (a derived point from
#: another topic can overtake it)
UNKNOWN_PROJECT = "_unknown"
#: the project a sink files a run under when the run's own directory cannot be written
#: (``DIRECTORY_ERRNOS``); readers read it with the run's other directories
FALLBACK_PROJECT = "_fallback"


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


def checked_ids(run_id: str, producer_id: str | None = None) -> None:
    """Raise UnsafeRecordError unless a record's ids are usable (consumers call this on decode).

    Everything from a topic is untrusted: run ids become directory names, producer ids keys of
    ledgers. Both must be what :func:`check_run_id` accepts (an Alert has no producer id).
    """
    for what, value in (("run_id", run_id), ("producer_id", producer_id)):
        if value is not None and not _RUN_ID.match(value):
            shown = repr(value[:60]) + (f"... ({len(value)} characters)" if len(value) > 60 else "")
            raise UnsafeRecordError(
                f"{what} {shown} is not usable: 1-128 letters, digits, '.', '_' or '-' expected"
            )


def path_segment(name: str) -> str:
    """Map any project or run name to one safe path segment (percent-encoding).

    Deterministic, and reversible up to :data:`MAX_SEGMENT` characters; a longer name keeps
    its start and ends with a hash of the whole name, so two long names never share a folder.
    """
    quoted = urllib.parse.quote(name, safe=" -_,+@")
    if quoted in {"", ".", ".."}:
        quoted = quoted.replace(".", "%2E") or "%00"
    if len(quoted) > MAX_SEGMENT:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        cut = quoted[: MAX_SEGMENT - 17]
        partial = cut.rfind("%", len(cut) - 2)  # never end inside a %XX escape
        quoted = (cut if partial == -1 else cut[:partial]) + "~" + digest
    return quoted


def printable(text: str) -> str:
    r"""``text`` for a terminal: every character that is not printable as its backslash escape.

    Names and messages come from topics (untrusted): a metric name holding a newline, an ANSI
    escape (``\x1b[2J`` clears the screen) or a right-to-left override would forge or hide a
    line of the console's output. Escaped, it reads as what it is.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
