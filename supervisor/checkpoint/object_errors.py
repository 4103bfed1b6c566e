"""How an `ObjectStoreStorage` request's failure reads: botocore/s3fs errors translated into the
``OSError`` s the runtime understands (`translate_error`)."""
from __future__ import annotations

import errno
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from supervisor.checkpoint.storage_base import PreconditionFailedError

__all__ = ["ConflictError", "translate_error"]


class ConflictError(PreconditionFailedError):
    """HTTP 409 ConditionalRequestConflict: retry the conditional write."""


def translate_error(error: BaseException, path: str, operation: str) -> OSError:
    """Maps a botocore/s3fs error to the ``OSError`` the runtime understands: 412 →
    `PreconditionFailedError`, 404 → ``FileNotFoundError``, 403 → ``PermissionError``,
    409 conditional conflict → retried by the caller, anything else (5xx after the retries,
    no connection, timeouts) → ``OSError(EIO)`` naming the path and the operation."""
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
