"""Jobs domain: per-job in-memory state (topology, assembly, frames), its persistence, and REST."""
