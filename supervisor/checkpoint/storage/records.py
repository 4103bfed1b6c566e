"""The JSON records a logdir holds, parsed as the untrusted input they are.

Anyone who can write to a logdir can leave anything in it: checkpoint and export manifests, lease
records, the finished mark, the lock's owner record, export eval records. Every reader of those
parses them here, so one hostile file (``"[" * 200000`` as a ``MANIFEST.json``, invalid UTF-8, a
number too large for a float, a field of the wrong type) never escapes as a `RecursionError`,
`MemoryError`, `OverflowError` or `KeyError` from deep inside a restore or a CLI command: each
failure becomes one `DamagedRecordError` (a `ValueError`) saying why, and the caller treats the
record as damaged (a restore falls back to an older checkpoint with a WARNING, the CLI lists the
checkpoint as not verified and goes on).

Example::

    data = parse_object(storage.read_bytes(path, max_bytes=64 << 10))  # DamagedRecordError: why
    step = fields(lambda: int(data["step"]), "manifest")                # the same for its fields
"""
from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

__all__ = ["DamagedRecordError", "DAMAGE", "parse_json", "parse_object", "fields"]

T = TypeVar("T")

#: What reading the fields of a parsed record may raise when they have the wrong type or shape.
DAMAGE = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError, MemoryError)


class DamagedRecordError(ValueError):
    """A record of a logdir cannot be used; the message says why (the caller names the file)."""


def parse_json(data: bytes | bytearray | memoryview | str) -> Any:
    """The JSON value of ``data`` (UTF-8 bytes or text); `DamagedRecordError` for anything else:
    not UTF-8, not JSON, nested too deeply for the parser, too large to hold."""
    try:
        text = bytes(data).decode("utf-8") if not isinstance(data, str) else data
    except UnicodeDecodeError as e:
        raise DamagedRecordError(f"not UTF-8 text ({e})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise DamagedRecordError("not usable JSON (nested too deeply to parse)") from None
    except MemoryError:
        raise DamagedRecordError(f"not usable JSON (too large to parse: {len(text)} characters)") from None
    except ValueError as e:  # JSONDecodeError, and an integer of more digits than Python converts
        raise DamagedRecordError(f"not valid JSON ({e})") from None


def parse_object(data: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """`parse_json` of a record that must be a JSON object."""
    value = parse_json(data)
    if not isinstance(value, dict):
        raise DamagedRecordError(f"not a JSON object (a {type(value).__name__})")
    return value


def fields(read: Callable[[], T], what: str = "record") -> T:
    """``read()``, which takes the fields of a parsed record (a ``what``); any failure of a field
    of the wrong type or shape (`DAMAGE`) becomes a `DamagedRecordError` naming it."""
    try:
        return read()
    except DamagedRecordError:
        raise
    except KeyError as e:
        raise DamagedRecordError(f"malformed {what} (no field {e})") from None
    except DAMAGE as e:
        raise DamagedRecordError(f"malformed {what} ({type(e).__name__}: {e})"[:500]) from None
