"""Runtime control of jobs by operators: mute, pause, maintenance windows, per-job thresholds."""
