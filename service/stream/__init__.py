"""stream."""
