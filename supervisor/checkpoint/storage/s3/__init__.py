"""The ``s3://`` backend of the storage seam, on fsspec's ``s3fs`` (SPEC §16): `store`
(`ObjectStoreStorage`), `objects` (multipart writes, ranged reads), `errors` (how a request runs
and fails), `config` (the client's options), `uploads` (unfinished multipart uploads). Imported
only by `supervisor.checkpoint.storage` when an ``s3://`` logdir is opened (the ``[s3]`` extra)."""
