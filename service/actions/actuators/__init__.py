"""Pluggable actuators: each turns an approved action into an effect, with dry-run and timeout."""
