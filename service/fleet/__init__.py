"""The fleet ledger: hardware across jobs (docs/fleet.md)."""
