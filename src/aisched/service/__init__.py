"""The live scheduler service: the control loop, the REST API, metrics, configuration."""
