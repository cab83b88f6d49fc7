"""Alembic environment and versions for the failslow database."""
