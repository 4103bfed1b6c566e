"""Who may write a logdir (SPEC §5.6, §16): `lock` (``lock="flock"|"lease"|"auto"``), `lease`
(exclusive generations on any `Storage`), `lease_record`, `holder` (is a holder on this host gone).
Imports only the storage seam: ownership knows nothing of checkpoints."""
