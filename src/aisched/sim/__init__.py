"""The simulator: trace loaders, the discrete-event engine, metrics and reports."""
