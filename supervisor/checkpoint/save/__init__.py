"""Writing checkpoints (SPEC §5.1, §5.2, §5.9): capture (`staging`, `overlap`, `copiers`,
`fingerprint`) -> `background` (the writer thread) -> `temp` (one staged checkpoint) -> `commit`
(manifest last) -> `publish` (the index, then retention); `in_flight` (a save in flight and its
failure, shared by both managers) and `failure_policy` (SPEC §5.2 as a pure function). Imports
`storage`, `ownership`, `layout`, `formats` and the package's `arguments`; never `load`."""
