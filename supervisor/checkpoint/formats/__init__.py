"""How a checkpoint's payload is encoded and decoded: `serialize` (``state.pt``: torch.save's zip
format), `safe_globals` / `dangerous_globals` (what ``torch.load(weights_only=True)`` may build),
`memory_file` (a file over bytes in memory), and the DCP format: `dcp_storage` (DCP's reader and
writer over the storage seam), `dcp_ranges` (item checksums), `dcp_reading` (a sharded checkpoint
loaded from verified bytes). Imports the storage seam and `layout`."""
