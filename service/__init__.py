"""failslow service: ingest, detection, incidents and operations over HTTP."""

__version__ = "0.1.0"
