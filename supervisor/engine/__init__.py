"""The session engine: `session` (`MonitoredSession`), `lifecycle` (creation, recovery, close),
`boundary` (the step boundary: agreed save/stop decisions), `dispatch` (hook calls),
`session_requests` (stop and save requests), `coordinator` (`Coordinator`, `LooperThread`),
`signals` (SIGTERM/SIGINT). Imports the foundation, `state`, `creators`, `checkpoint` and
`distributed`; never the front doors."""
