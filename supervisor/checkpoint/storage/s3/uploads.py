"""Unfinished multipart uploads of an object store (SPEC §16): a writer killed mid-upload leaves
one behind. No listing of objects shows it (its parts are not an object yet), but the store keeps
— and bills — the parts until the upload is aborted (or a bucket lifecycle rule does it). The
logdir's next writer aborts those under its checkpoint prefixes when it opens the logdir
(`supervisor.checkpoint.save.commit.clean_transient`), as it removes manifest-less prefixes."""
from __future__ import annotations

import logging
from typing import Any, Callable

from supervisor.checkpoint.storage.s3.errors import translate_error

__all__ = ["abort_uploads"]

logger = logging.getLogger(__name__)


def abort_uploads(store: Any, path: str, accept: Callable[[str], bool]) -> list[str]:
    """Aborts (a WARNING each) every unfinished multipart upload under ``path/`` whose first name
    below it ``accept`` takes; returns their URLs. ``store``: an `ObjectStoreStorage` (its ``request``
    and ``call``). Best effort: a store that cannot list them is a WARNING, never an error (the
    leftover parts cost storage, not correctness). Every request is bounded (``store.request``). Only for the logdir's one writer: another
    writer's upload in flight would be aborted too."""
    bucket, _, key = path.split("://", 1)[-1].partition("/")
    prefix = key.strip("/") + "/" if key.strip("/") else ""
    aborted: list[str] = []
    marker: dict[str, str] | None = {}
    try:
        while marker is not None:
            page = store.request("list_multipart_uploads", path, Bucket=bucket, Prefix=prefix, **marker)
            for upload in page.get("Uploads", ()):
                if accept(upload["Key"][len(prefix):].split("/", 1)[0]):
                    url = f"s3://{bucket}/{upload['Key']}"
                    logger.warning("aborting the unfinished upload of %s (started %s) left behind by an interrupted "
                                   "checkpoint write", url, upload.get("Initiated"))
                    store.call("abort_multipart_upload", url, UploadId=upload["UploadId"])
                    aborted.append(url)
            marker = ({"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
                      if page.get("IsTruncated") else None)
    except Exception as e:  # noqa: BLE001 - logged, see the docstring
        logger.warning("could not abort the unfinished uploads under %s: %s", path,
                       e if isinstance(e, OSError) else translate_error(e, path, "list_multipart_uploads"))
    return aborted
