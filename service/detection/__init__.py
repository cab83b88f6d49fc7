"""Detection wiring: runs the pure detectors over each job's closed frames and persists findings."""
