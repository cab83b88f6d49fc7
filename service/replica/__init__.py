"""The owning side of the bus (docs/replicas.md): which replica owns which partition of jobs,
applying the stream to the jobs it owns, and the snapshots a new owner resumes from."""
