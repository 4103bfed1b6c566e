"""How an `ObjectStoreStorage` request runs and how its failure reads: every request to the store
is a coroutine of the s3fs client run on its event loop within ``request_timeout``
(`run_bounded`: `StorageTimeoutError` past it), and botocore/s3fs errors are translated into the
``OSError`` s the runtime understands (`translate_error`). The client's modules (fsspec's loop,
botocore's errors) are imported where a request runs, not with this module: an
`ObjectStoreStorage` is made without importing its client (`supervisor.checkpoint.storage.s3.store`)."""
from __future__ import annotations

import errno
from typing import Any, Awaitable, Callable

from supervisor.checkpoint.storage.base import PreconditionFailedError

__all__ = ["ConflictError", "StorageTimeoutError", "run_bounded", "translate_error"]


class ConflictError(PreconditionFailedError):
    """HTTP 409 ConditionalRequestConflict: retry the conditional write."""


class StorageTimeoutError(TimeoutError):
    """A request to the object store did not finish within ``request_timeout`` (connect, body,
    answer and botocore's retries together) and was abandoned; the message names the operation,
    the URL and the bound. An ``OSError`` (``errno.ETIMEDOUT``), so every path that handles a
    failed request handles it."""


def run_bounded(loop: Any, timeout: float, function: Callable[..., Awaitable[Any]], *args: Any, path: str,
                operation: str, **kwargs: Any) -> Any:
    """``await function(*args, **kwargs)`` on the client's event loop ``loop`` (s3fs runs its own,
    on a thread), abandoned (cancelled: its connection closed) after ``timeout`` seconds with
    `StorageTimeoutError`; any other failure translated (`translate_error`)."""
    import fsspec.asyn
    from fsspec.exceptions import FSTimeoutError

    try:
        return fsspec.asyn.sync(loop, function, *args, timeout=timeout, **kwargs)
    except FSTimeoutError as e:
        raise StorageTimeoutError(
            errno.ETIMEDOUT, f"{path}: {operation} got no complete answer within request_timeout={timeout:g} s "
            "(storage_options['request_timeout']) and was abandoned: the store accepted the connection but stayed "
            "silent or too slow. Check the endpoint and the network, or raise request_timeout") from e
    except Exception as e:  # noqa: BLE001 - translated, re-raised
        raise translate_error(e, path, operation) from e


def translate_error(error: BaseException, path: str, operation: str) -> OSError:
    """Maps a botocore/s3fs error to the ``OSError`` the runtime understands: 412 →
    `PreconditionFailedError`, 404 → ``FileNotFoundError``, 403 → ``PermissionError``,
    409 conditional conflict → retried by the caller, `StorageTimeoutError` unchanged, anything else (5xx after the retries,
    no connection, timeouts) → ``OSError(EIO)`` naming the path and the operation."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(error, StorageTimeoutError):
        return error
    client_error = error if isinstance(error, ClientError) else _cause_of_type(error, ClientError)
    if client_error is not None:
        info = client_error.response.get("Error", {})
        code = str(info.get("Code", ""))
        status = client_error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = f"{path}: {operation} answered {status} {code}: {info.get('Message', '')}".rstrip(": ")
        if status == 412 or code == "PreconditionFailed":
            return PreconditionFailedError(f"{message} (condition {info.get('Condition', '?')})")
        if status == 409 and code == "ConditionalRequestConflict":
            return ConflictError(message)
        if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NoSuchUpload", "404"):
            return FileNotFoundError(errno.ENOENT, message)
        if status == 403 or code == "AccessDenied":
            return PermissionError(errno.EACCES, message)
        return OSError(errno.EIO, message)
    if isinstance(error, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, f"{path}: {operation}: {error}")
    if isinstance(error, OSError) and not isinstance(error, (BotoCoreError,)) and error.errno:
        return type(error)(error.errno, f"{path}: {operation}: {error}")
    return OSError(errno.EIO, f"{path}: {operation} failed: {type(error).__name__}: {error}")


def _cause_of_type(error: BaseException, kind: type) -> Any:
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 10:
        if isinstance(current, kind):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None
