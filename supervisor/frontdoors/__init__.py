"""The front doors: `supervisor` (`Supervisor`), `training_session` (`MonitoredTrainingSession`,
`SingularMonitoredSession`), `checkpoint_arguments` (the checkpoint arguments both check),
`services` (the Supervisor's time-based services). They build the environment, the creator and
the hooks, and hand them to the engine."""
