"""Ingest domain: ``POST /v1/ingest`` — decoding, validation and acceptance of v1 envelopes."""
