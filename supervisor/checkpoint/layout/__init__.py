"""What a logdir holds and what its names mean (SPEC §2, §5.1, §5.3, §5.5, §10.2, §16): `format`
(names, the manifest), `index` (the ``checkpoint`` file), `finished` (the training-finished mark),
`retention` (pure keep/delete rules), `verify` (a checkpoint against its manifest), `fencing`
(per-save data roots and generation-conditional writes). Imports the storage seam and
`ownership` (a fenced write that lost the lease raises its `LeaseLostError`)."""
