"""Load generation for end-to-end benchmarks."""
