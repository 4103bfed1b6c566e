"""How `supervisor.checkpoint.storage.s3.store.ObjectStoreStorage` is configured: the client's
options (`default_options`) and this project's transfer knobs (`TransferKnobs`), both taken from
``storage_options`` (`split_options`).

Configuration, the standard way: credentials, region and endpoint from the ``AWS_*`` environment
(``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` included — botocore reads them), ``~/.aws``,
fsspec's ``FSSPEC_S3_*`` variables, then ``storage_options=`` (passed to ``S3FileSystem``;
``storage_options["client_kwargs"]["endpoint_url"]`` or ``endpoint_url=`` point it at another
server). What they do not set, this module sets:

* **Retries, bounded**: botocore's ``standard`` retry mode with ``total_max_attempts=5`` (its
  default is 3 in standard mode): throttling (503 SlowDown, 429) waits ``rand(0,1)·2^n`` s
  (at most 20 s), other transient errors (500/502/504, connection resets, timeouts) waits
  ``rand(0,1)·0.05·2^n`` s; after the last attempt the error is raised. s3fs's own retry layer is
  turned off (``retries=1``) so the two never multiply. Override with
  ``storage_options={"config_kwargs": {"retries": {...}}}``, or with ``AWS_MAX_ATTEMPTS``/
  ``AWS_RETRY_MODE`` in the environment (then botocore's own defaults and those apply, as for
  any AWS client: standard mode 3 attempts, legacy 5); ``s3fs_retries`` sets s3fs's layer.
* **Timeouts**: ``connect_timeout=10`` s, ``read_timeout=60`` s (botocore's: per connection
  attempt and per socket read), and this project's ``request_timeout`` (`DEFAULT_REQUEST_TIMEOUT`,
  120 s): the longest one request may take **end to end** — connecting, sending its body (a
  ``PutObject``, a multipart part), waiting for the answer, reading it (a streamed body: each
  ``READ_PIECE_BYTES`` piece), botocore's retries included. botocore's own timeouts do not bound
  a whole request: a body sent into a connection that is accepted but never read (or a
  ``100-continue`` never answered) waits forever. Past ``request_timeout`` the request is
  abandoned (its connection closed) and fails with
  `supervisor.checkpoint.storage.s3.errors.StorageTimeoutError` (a ``TimeoutError``) naming the
  operation, the URL and the bound. Set it in ``storage_options`` (seconds, a positive number;
  checked when the storage is made, the error naming the key).
* ``use_listings_cache=False``: listings always ask the server (a writer and a reader in two
  processes must see each other's objects).

``storage_options`` may also carry the transfer knobs (`TransferKnobs`) ``part_size``,
``max_concurrency``, ``min_range_size``, ``multipart_checksum`` and ``request_timeout``. Uploads (``open_write``)
fill parts of ``part_size`` bytes (8 MiB), upload them on ``max_concurrency`` threads (8) while
the caller keeps writing, with at most ``2 × max_concurrency`` parts in memory, and compute the
CRC-32 of the stream as it is written (the project's `supervisor.checkpoint.storage.fileio.crc32`; no second
read). A file smaller than one part is one ``PutObject``. A multipart upload is created with
``ChecksumAlgorithm=multipart_checksum`` (``"CRC32"``): each part travels with its CRC-32,
which the server checks, and the object gets a composite checksum of its parts' — what the AWS
CLI does with ``--checksum-algorithm CRC32``; without one (None, for a store that refuses the
header) S3 computes a full-object CRC-64 at completion, and moto does it in Python over a
further copy of the object. A whole-object read (a verified restore, ``load_checkpoint``, the
evaluator) splits the object into ``max_concurrency`` ranges of at least ``min_range_size``
(16 MiB: AWS's advice for ranged reads is 8–16 MiB), one ``GetObject`` each, all in flight at
once and each streamed straight into the private copy, its CRC-32 computed as it arrives: a
1 GiB object is 8 requests of 128 MiB, a 64 MiB one 4 of 16 MiB. Few large ranges, because a
server may pay per request what the object costs (moto copies the whole object for each
ranged ``GetObject``: see ``benchmarks/object_store.py``).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from typing import Any, Mapping

from supervisor.checkpoint.storage.s3.key_cache import read_keys, write_keys

__all__ = ["CHECKSUM_ALGORITHMS", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_MAX_CONCURRENCY", "DEFAULT_MIN_RANGE_SIZE",
           "DEFAULT_MULTIPART_CHECKSUM", "DEFAULT_PART_SIZE", "DEFAULT_REQUEST_TIMEOUT", "MIN_PART_SIZE", "TransferKnobs",
           "check_options", "default_options", "make_filesystem", "option_keys", "split_options"]

DEFAULT_PART_SIZE = 8 << 20
MIN_PART_SIZE = 5 << 20  # S3's smallest part but the last
DEFAULT_MAX_CONCURRENCY = 8
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_MIN_RANGE_SIZE = 16 << 20
DEFAULT_MULTIPART_CHECKSUM = "CRC32"
#: Seconds one request may take end to end (the module docstring): twice botocore's read_timeout.
DEFAULT_REQUEST_TIMEOUT = 120.0
CHECKSUM_ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")


@dataclasses.dataclass(frozen=True)
class TransferKnobs:
    """How objects are uploaded and read (the module docstring); checked when made."""

    part_size: int = DEFAULT_PART_SIZE
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    min_range_size: int = DEFAULT_MIN_RANGE_SIZE
    multipart_checksum: str | None = DEFAULT_MULTIPART_CHECKSUM
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    def __post_init__(self) -> None:
        if self.part_size < 1 or self.max_concurrency < 1:
            raise ValueError(f"part_size and max_concurrency must be positive, got {self.part_size}, "
                             f"{self.max_concurrency}")
        if self.part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes (5 MiB: S3's smallest part but the "
                             f"last), got {self.part_size}")
        if self.min_range_size < 1:
            raise ValueError(f"min_range_size must be a positive number of bytes, got {self.min_range_size}")
        if self.multipart_checksum is not None and self.multipart_checksum not in CHECKSUM_ALGORITHMS:
            raise ValueError(f"multipart_checksum must be one of {', '.join(CHECKSUM_ALGORITHMS)} or None, got "
                             f"{self.multipart_checksum!r}")
        timeout = self.request_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"storage_options['request_timeout'] must be a positive, finite number of seconds (the "
                             f"longest one request to the object store may take, end to end), got {timeout!r}")
        for name in ("part_size", "max_concurrency", "min_range_size"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "request_timeout", float(timeout))


def default_options(storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``S3FileSystem`` keyword arguments: this module's defaults (see the module docstring),
    overridden by fsspec's ``FSSPEC_S3_*`` configuration, overridden by ``storage_options``."""
    user = {**_fsspec_s3_config(), **dict(storage_options or {})}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "endpoint_url" not in user:  # explicit: fsspec caches clients by their arguments,
        user["endpoint_url"] = endpoint          # and one made before the variable was set would stay
    config = dict(user.get("config_kwargs") or {})
    if not (os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE")):
        config.setdefault("retries", {"mode": "standard", "total_max_attempts": DEFAULT_MAX_ATTEMPTS})
    config.setdefault("connect_timeout", 10)
    config.setdefault("read_timeout", 60)
    return {"use_listings_cache": False, "s3fs_retries": 1, **user, "config_kwargs": config}


def _fsspec_s3_config() -> dict[str, Any]:
    """fsspec's ``s3`` configuration: what its ``FSSPEC_S3*`` variables, its configuration files
    (``FSSPEC_CONFIG_DIR``, default ``~/.config/fsspec``) or code that imported it set. Read
    without importing fsspec (~0.15 s, which a local session never pays) when it cannot have any."""
    folder = os.environ.get("FSSPEC_CONFIG_DIR", os.path.join(os.path.expanduser("~"), ".config", "fsspec"))
    s3_variables = [k for k in os.environ if k.startswith("FSSPEC_") and k[7:].split("_", 1)[0].lower() == "s3"]
    if "fsspec" not in sys.modules and not s3_variables and not os.path.isdir(folder):
        return {}
    import fsspec.config

    return dict(fsspec.config.conf.get("s3", {}))


def split_options(storage_options: Mapping[str, Any] | None) -> tuple[dict[str, Any], TransferKnobs, int]:
    """``(S3FileSystem keyword arguments, transfer knobs, s3fs's retries)`` of ``storage_options``
    (checked first: `check_options`)."""
    check_options(storage_options)
    options = default_options(storage_options)
    names = [field.name for field in dataclasses.fields(TransferKnobs)]
    knobs = TransferKnobs(**{name: options.pop(name) for name in names if name in options})
    return options, knobs, int(options.pop("s3fs_retries"))


def make_filesystem(options: Mapping[str, Any], s3fs_retries: int) -> Any:
    """The ``s3fs.S3FileSystem`` of `split_options`' ``(options, s3fs_retries)``: imports the
    client (`ObjectStoreStorage.fs` calls it on first use)."""
    import fsspec

    fs = fsspec.filesystem("s3", **options)
    fs.retries = s3fs_retries  # a class attribute of S3FileSystem, not an argument
    return fs


# ---------------------------------------------------------------- checking storage_options
#: The keys of ``storage_options`` this module takes itself (`TransferKnobs`, s3fs's retry layer).
OWN_KEYS = ("part_size", "max_concurrency", "min_range_size", "multipart_checksum", "s3fs_retries", "request_timeout")
#: What ``S3FileSystem`` hands to fsspec's base class, and fsspec's instance cache's switch.
_FSSPEC_KEYS = ("use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache")
_BOOL, _STR, _DICT, _INT, _NUMBER = "True or False", "a str or None", "a dict or None", "an integer", "a number or None"
#: The expected type of the keys whose values are simple (others are left to the client).
_KINDS = {
    "": {**dict.fromkeys(("anon", "use_ssl", "requester_pays", "version_aware", "default_fill_cache", "cache_regions",
                          "fixed_upload_size", "local_expiry_check", "use_listings_cache", "skip_instance_cache"),
                         _BOOL),
         **dict.fromkeys(("endpoint_url", "key", "secret", "token", "username", "password", "profile",
                          "multipart_checksum"), _STR),
         **dict.fromkeys(("client_kwargs", "config_kwargs", "s3_additional_kwargs", "session_vars"), _DICT),
         **dict.fromkeys(("part_size", "max_concurrency", "min_range_size", "s3fs_retries"), _INT),
         "listings_expiry_time": _NUMBER},  # request_timeout: checked by TransferKnobs
    "client_kwargs": {**dict.fromkeys(("endpoint_url", "region_name", "api_version", "aws_access_key_id",
                                       "aws_secret_access_key", "aws_session_token", "aws_account_id"), _STR),
                      "use_ssl": _BOOL},
    "config_kwargs": {"connect_timeout": _NUMBER, "read_timeout": _NUMBER, "retries": _DICT, "s3": _DICT,
                      "proxies": _DICT, "region_name": _STR, "signature_version": _STR},
}


def _parameters(function: Any, *skip: str) -> set[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n for n, p in inspect.signature(function).parameters.items() if p.kind in kinds and n not in ("self", *skip)}


#: The files the client's keys are read from (`_client_keys`), per package: their identity (path,
#: size, mtime, inode) names the disk cache of the keys (`_cache_file`), so a reinstall renews it.
_KEY_SOURCES = {"s3fs": ("__init__.py", "core.py"), "aiobotocore": ("__init__.py", "session.py", "config.py"),
                "botocore": ("__init__.py", "session.py", "config.py"), "fsspec": ("__init__.py",)}
_LEVELS = ("", "client_kwargs", "config_kwargs")


@functools.lru_cache(maxsize=None)
def option_keys() -> dict[str, frozenset[str]]:
    """The keys ``storage_options`` may hold (``""``) and those of its nested ``client_kwargs``
    and ``config_kwargs``: the installed clients' (`_client_keys`), fsspec's and this module's
    `OWN_KEYS`. Read from a disk cache per installed client (`_cache_file`) when there is one, so
    checking options at a front door does not import the client (s3fs, aiobotocore, botocore:
    ~0.4 s, which a resume from a local tier would otherwise wait for before its first step)."""
    path = _cache_file()
    keys = read_keys(path, _LEVELS) if path is not None else None
    if keys is None:
        keys = _client_keys()
        if path is not None:
            write_keys(path, keys, _LEVELS)
    return {"": frozenset(keys[""] | set(_FSSPEC_KEYS) | set(OWN_KEYS)), "client_kwargs": frozenset(keys["client_kwargs"]),
            "config_kwargs": frozenset(keys["config_kwargs"])}


def _client_keys() -> dict[str, set[str]]:
    """Read from the installed clients' signatures (imports them): ``s3fs.S3FileSystem``'s
    arguments and the ``AioSession`` arguments it passes its other keywords to; botocore's
    ``create_client`` arguments; botocore's ``Config`` options and aiobotocore's ``AioConfig``'s."""
    import aiobotocore.config
    import aiobotocore.session
    import botocore.config
    import botocore.session
    import s3fs

    top = _parameters(s3fs.S3FileSystem.__init__) | _parameters(aiobotocore.session.AioSession.__init__)
    client = _parameters(botocore.session.Session.create_client, "service_name")
    config = set(botocore.config.Config.OPTION_DEFAULTS) | _parameters(aiobotocore.config.AioConfig.__init__)
    return {"": top, "client_kwargs": client, "config_kwargs": config}


def _cache_dir() -> str:
    """Where `option_keys` caches the client's keys: ``$XDG_CACHE_HOME/torch-supervisor`` (default
    ``~/.cache/torch-supervisor``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch-supervisor")


def _cache_file() -> str | None:
    """The cache file of the installed clients' keys, named by the identity of `_KEY_SOURCES`
    (found without importing them); None when one is not installed (the check then imports it
    and fails naming the extra)."""
    stamp = [sys.version]
    for package, files in _KEY_SOURCES.items():
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = list(spec.submodule_search_locations)[0]
        for name in files:
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                return None
            stamp.append(f"{folder}/{name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
    digest = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:24]
    return os.path.join(_cache_dir(), f"s3-option-keys-{digest}.json")


def check_options(storage_options: Mapping[str, Any] | None) -> None:
    """Refuses, before any client is made, a key the client does not take (`ValueError` naming
    it and the nearest valid key, or the nested dict it belongs in) and a value of the wrong
    type for the simple keys (`TypeError` naming ``storage_options[key]`` and the value)."""
    keys = option_keys()
    _check_level("", storage_options or {}, keys)
    for nested in ("client_kwargs", "config_kwargs"):
        if (storage_options or {}).get(nested) is not None:
            _check_level(nested, storage_options[nested], keys)


def _check_level(nested: str, options: Mapping[str, Any], keys: dict[str, frozenset[str]]) -> None:
    where = f"storage_options[{nested!r}]" if nested else "storage_options"
    for key, value in options.items():
        if key not in keys[nested]:
            raise ValueError(f"{where} has the key {key!r}, which the s3:// client does not take; "
                             f"{_nearest(nested, key, keys)}")
        kind = _KINDS[nested].get(key)
        if kind is not None and not _is_kind(value, kind):
            raise TypeError(f"{where}[{key!r}] must be {kind}, got {value!r}")


def _nearest(nested: str, key: Any, keys: dict[str, frozenset[str]]) -> str:
    if not nested:
        home = next((n for n in ("client_kwargs", "config_kwargs") if key in keys[n]), None)
        if home is not None:
            return f"it belongs in {home}: storage_options={{{home!r}: {{{key!r}: ...}}}}"
    close = difflib.get_close_matches(str(key), sorted(keys[nested]), n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    if nested:
        return f"it takes {', '.join(sorted(keys[nested]))}"
    return ("it takes s3fs.S3FileSystem's arguments (endpoint_url, key, secret, client_kwargs, config_kwargs, "
            f"...) and {', '.join(OWN_KEYS)}")


def _is_kind(value: Any, kind: str) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _INT:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if value is None:
        return True
    if kind == _STR:
        return isinstance(value, str)
    if kind == _DICT:
        return isinstance(value, Mapping)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
