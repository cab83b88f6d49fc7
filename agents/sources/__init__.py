"""Telemetry sources the node agent reads besides the SDK (one source per module)."""
