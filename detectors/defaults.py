"""The detectors' default parameters, in one place.

Detectors take plain keyword arguments whose defaults come from here, and the service's settings
refer to the same values (``failslow.service.detection.settings``), so a default exists once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Defaults:
    # A rank is suspect when its peers wait for it more than this share of the step. 0.02 is what
    # the service has always run with and what every evaluation measured (`failslow eval`).
    late_fraction: float = 0.02
    compute_ratio: float = 1.05  # compute time vs role peers that makes a rank suspect
    link_ratio: float = 0.85  # bus bandwidth vs its references below which a comm is suspect
    # ... and only when one of its slow comms loses at least this share of the step against
    # its reference: two 1 ms eager sends slowed by CPU jitter on a 300 ms step are no
    # fail-slow; a 3x slower cable carrying only pipeline sends costs ~1.3%, a slow NIC more
    link_cost: float = 0.01
    job_slowdown_ratio: float = 1.1  # job step time vs baseline for a job-wide slowdown
    # The least evidence for anything to open: a deviation seen in fewer frames (steps) than
    # this is never an incident (a hiccup, a checkpoint, one rank stalling across a step
    # boundary). Even far past the thresholds ("strong") a condition needs this many in a row.
    min_evidence: int = 4
    # ... except a severe one: a rank at least 1.4x as slow as its peers (a node's ranks, a
    # link's transfers 2x) in this many steps in a row opens (issue 32: a 3x straggler waited as
    # long as a 1.2x one; >= 1.5x faults are to be named within 2 steps of their onset). Not
    # fewer: one stall crossing a step boundary spans two frames.
    severe_evidence: int = 3
    severe_ratio: float = 1.4  # compute vs role peers from which a suspect frame is severe
    severe_link: float = 2.0  # transfer slowdown from which a suspect link frame is severe
    window: int = 5  # frames in the sliding decision window
    # A small job (< 8 ranks) whose ranks' compute ratios spread by this much (pooled robust
    # spread; shared CPUs) has ranks 2-3x slow for a few frames with nothing wrong (4-5 suspect
    # frames of 10 in the lab's healthy pipelines): there a slow GPU needs 7 of 10
    noisy_small_spread: float = 0.1
    noisy_small_evidence: tuple[int, int] = (10, 7)
    # ... and a job whose compute is unobservable (lateness its only signal): noisy when its
    # ranks' lateness, pooled over recent frames, spreads by this share of a step or more
    noisy_blind_spread: float = 0.02
    noisy_blind_evidence: tuple[int, int] = (15, 11)
    open_after: int = 4  # suspect frames within the window before a condition opens
    resolve_after: int = 8  # consecutive clean frames before a condition resolves
    warmup_frames: int = 5  # frames ignored at job start
    baseline_frames: int = 500  # the baseline is the fastest block median within this many
    baseline_block: int = 10  # frames per baseline block
    history: int = 64  # frames of per-rank history kept for dating and reports
    update_every: int = 5  # frames between reports on open conditions
    # Shortest time a collective may block, and a rank complete nothing, before it is hung. Not
    # below the agents' in-flight report delay (ours and the simulator's report an op in flight
    # after 1 s): a rank waiting inside an op not yet reported looks quiet, and a 10x straggler
    # then had its next pipeline stage blamed. 2 s named a 0.35 s-step job's hangs after ~6
    # steps, 1 s after 3.5-4.6 (issue 32).
    hang_floor_s: float = 1.0
    # A collective blocked for 3 step times is hung (a straggler of up to ~4x keeps its peers
    # waiting less). One blocked for ``hang_suspect_steps`` step times is hung when the ranks it
    # waits for have completed nothing for ``hang_quiet_factor`` times their own longest recent
    # gap between two completed calls (a straggler f times slower stretches its gaps f times;
    # the simulator's noise spikes stretch one segment up to 5x): a tensor-parallel rank
    # completes a call every few milliseconds, its hang is named after about a step.
    hang_suspect_steps: float = 1.0
    hang_quiet_factor: float = 6.0
    hang_startup_s: float = 60.0  # how long a communicator's first collective may block
    dead_after_s: float = 5.0  # event time without envelopes after which a host is dead
    # Severity from the measured impact (the job's step time against its baseline): below
    # ``major_slowdown`` an incident is minor (watched and notified, never acted on), from
    # ``critical_slowdown`` (and every hang) critical.
    major_slowdown: float = 1.05
    critical_slowdown: float = 1.5


DEFAULTS = Defaults()
