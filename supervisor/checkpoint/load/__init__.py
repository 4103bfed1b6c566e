"""Reading checkpoints (SPEC §5.4, §10.4, §13): `loader` (the ONE verified loader: read once into a
private copy, checksummed while reading), `choose` (the newest good checkpoint, falling back),
`apply` (onto a live training state), `private_copy` / `shared_copy` (the bytes read once, per
process or per job), `variables` + `ranged` (TensorFlow's reader API: ``list_variables``,
``load_variable``, `CheckpointReader`), `checkpoint_utils` (``load_checkpoint``, ``restore_partial``,
``checkpoints_iterator``). Imports `storage`, `layout`, `formats`; never `save` or `sharded`."""
