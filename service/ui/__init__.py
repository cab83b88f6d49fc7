"""The status page: ``GET /ui``, one static HTML file that talks to the REST API (no build)."""
