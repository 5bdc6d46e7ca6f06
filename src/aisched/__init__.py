"""aisched: an AI compute-resource scheduler with a trace-driven simulator."""

__version__ = "0.1.0"
