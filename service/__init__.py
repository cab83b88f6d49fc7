"""failslow service: ingest, detection, incidents and operations over HTTP."""
