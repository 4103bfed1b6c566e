"""The disk cache of the object store client's option keys (`config.option_keys`): a JSON file
per installed client under ``$XDG_CACHE_HOME/torch-supervisor`` (named in `config._cache_file`),
so that checking ``storage_options`` at a front door imports no client. It is this user's cache,
never a logdir: the one module of the s3 storage that writes a local file outside the seam
(tests/checkpoint/test_storage_rule.py exempts it for that reason). A cache that is absent,
damaged or not writable is never an error: the keys are read from the client again."""
from __future__ import annotations

import json
import logging
import os

__all__ = ["read_keys", "write_keys"]

logger = logging.getLogger(__name__)


def read_keys(path: str, levels: tuple[str, ...]) -> dict[str, set[str]] | None:
    """The cached keys of each of ``levels``; None when the file is absent or not such a record."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None  # absent or damaged: computed again (and rewritten)
    if not (isinstance(data, dict) and all(isinstance(data.get(k), list) and all(isinstance(n, str) for n in data[k])
                                           for k in levels)):
        return None
    return {k: set(data[k]) for k in levels}


def write_keys(path: str, keys: dict[str, set[str]], levels: tuple[str, ...]) -> None:
    """Writes the cache whole (a temp file put in place) or not at all (DEBUG)."""
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temp, "w", encoding="utf-8") as f:
            json.dump({k: sorted(keys[k]) for k in levels}, f)
        os.replace(temp, path)  # whole or not at all, for a process reading it meanwhile
    except OSError as e:  # a read-only home: the keys are read from the client again next time
        logger.debug("could not cache the s3 client's option keys in %s: %s", path, e)
        try:
            os.unlink(temp)
        except OSError:
            pass
