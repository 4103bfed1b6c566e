"""What the exporters of `train_and_evaluate` (SPEC §10, `supervisor.estimator.exporters`:
`LatestExporter`, `BestExporter`, `FinalExporter` and the public export readers) share: what an
export is and how it is written, found, read back and removed.

- `base.py`: `Exporter`, the protocol and the shared bookkeeping (leftovers, garbage collection);
- `writer.py`: an export written whole (staged, then published) on any storage;
- `files.py`: the export directory's names, listing and records (what was exported at which step);
- `objects.py`: what an export holds (the model, its metadata) and how it is loaded back.
"""
