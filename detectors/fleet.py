"""Fleet health: evidence about one piece of hardware pooled across the jobs it ran in.

A job sees its GPUs, hosts and NICs for minutes to days and judges them against their peers in
that job only. A GPU 6% slower than its peers sits below every per-job threshold, forever, yet it
costs every job it joins ~6% of its time. This module pools what the jobs saw:

**Speed.** Each job gives, per part, the mean ``y_j`` of its per-frame log compute ratio against
its role peers (``log 1.06`` = 6% slower) and the spread of those frames. The part's own
slowness ``mu`` is estimated by a normal-normal model with shrinkage towards the fleet (most
hardware is healthy, so the prior is ``N(0, prior_sd^2)``)::

    y_j ~ N(mu, s_j^2 / n_eff_j + tau^2)

``tau`` is how much one healthy part's reading moves from job to job (placement, role peers,
thermal state): estimated from the whole fleet's readings, robustly (median absolute deviation:
the few faulty parts do not move it), never below ``tau_floor``. ``n_eff`` caps the frames one
job counts for, since consecutive frames are correlated. One short job says little, ten jobs say
a lot: the posterior sd falls as ``1/sqrt(sum of weights)``.

A part is **slow** when the lower end of its credible interval (``mean - z sd``) is above
``log(flag_ratio)``: the fleet is confident it is at least that much slower than its peers.

**Link speed.** A NIC's readings are link checks (qualification runs, probe campaigns): per
check, ``log(reference / best)``, ``best`` the fastest pair through its host
(:func:`link_readings`); and jobs' passive data: per frame, the job's median fastest
communicator over the host's fastest, where its communicators share no other host
(:mod:`.fleet_links`). They are judged by the same model with :meth:`FleetModel.links`'
settings: one check or one job is one reading, a wide prior and a high floor of the spread
(link speeds move far more than compute times), slow above 1.2x after a few readings.

**Incidents.** Incidents naming a part (a slow link on a NIC, a hang on a host) count with a
weight that halves every ``half_life_s`` of event time; the part's rate per observed hour is
shrunk towards the fleet's rate with ``prior_hours`` of pseudo-exposure. A part is a **repeat
offender** when incidents named it in at least ``min_incident_jobs`` distinct jobs (recently,
after decay) and its shrunk rate is ``rate_factor`` times the fleet's. A host that failed once
and then ran clean for weeks decays back to the fleet.

**Cost.** The job time a part cost: incidents' lost time (duration x the share of the step time
the incident's subject took) plus, for a slow part, its excess ``1 - 1/slowness`` of the time it
was observed in jobs; for a NIC, what its transfers lost in the jobs' passive readings (a link
30% slower does not make a job 30% slower; a NIC slow only in its link checks is priced by its
incidents). Offenders are ranked by it (:func:`speed_cost`).

Pure functions of numbers: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np


class PartKind(StrEnum):
    """What the fleet ledger keeps: hosts, GPUs and NICs (the ``kind`` of a fleet part)."""

    HOST = "host"
    GPU = "gpu"
    NIC = "nic"


class IdSource(StrEnum):
    """Where a GPU's identity comes from: the best the agent could read."""

    UUID = "uuid"  # NVML / nvidia-smi: survives moving the card to another slot or host
    PCI = "pci"  # the PCI bus id: stable while the card stays in its slot
    INDEX = "index"  # the local device index only: the slot, not the card


class PartState(StrEnum):
    """A part's standing in the fleet."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"  # the evidence says slow or a repeat offender: drain hint proposed
    FAILED = "failed"  # failed hard (a hang or a dead host on it): out until repaired
    PROBATION = "probation"  # back from repair: watched until it runs clean for a while


@dataclass(frozen=True, slots=True)
class JobReading:
    """What one job saw of one part: per-frame log compute ratios against role peers."""

    n: int  # frames with a reading
    mean: float  # mean of log(compute ratio); > 0 slower than peers
    var: float  # variance of the per-frame values
    observed_s: float  # event time the part was observed in the job
    lost_s: float = 0.0  # job time its slowness cost there, as measured (a NIC's transfers)


@dataclass(frozen=True, slots=True)
class IncidentMark:
    """One incident that named the part."""

    job: str
    at_s: float  # event time (s since epoch) the incident opened
    lost_s: float  # job time lost to it
    hard: bool  # a hard failure (hang, dead host), not a slowdown


@dataclass(frozen=True, slots=True)
class FleetModel:
    """The model's settings (``FAILSLOW_FLEET__*`` in the service)."""

    flag_ratio: float = 1.03  # slower than this, confidently: a slow part
    z: float = 3.0  # how confident: the lower end of the interval is mean - z sd
    prior_sd: float = 0.02  # the fleet prior on a part's log slowness
    tau_floor: float = 0.01  # a healthy part's job-to-job spread is never taken below this
    n_eff_cap: int = 30  # the most frames one job's reading counts for
    min_frames: int = 20  # a job with fewer frames of a part says nothing of its speed
    half_life_s: float = 14 * 86400.0  # incidents' weight halves every this much event time
    prior_hours: float = 24.0  # pseudo-exposure of the incident-rate prior
    rate_factor: float = 3.0  # a repeat offender's rate against the fleet's
    min_incident_jobs: int = 2  # distinct jobs that must have named it
    min_jobs: int = 1  # readings (jobs, or link checks) before a part can be called slow
    link: bool = False  # readings are link speeds (a NIC's): worded and priced so (speed_cost)
    # links: jobs' passive readings spread far less than checks (one job's frames against its
    # own hosts, not a path measured now and then): their own spread, with this floor
    passive_tau_floor: float = 0.03

    def passive(self, r: JobReading) -> bool:
        """A link reading from a job's passive data (it has observed time; a check has none)."""
        return self.link and r.observed_s > 0

    def counts(self, r: JobReading) -> bool:
        """Whether a reading says something of the part's speed: a job's, with ``min_frames``
        frames or more; for links also a link check (one check, one reading: no observed
        time)."""
        if r.n < 1 or not math.isfinite(r.mean):
            return False
        return r.n >= self.min_frames or (self.link and r.observed_s == 0)

    def links(self, *, flag_ratio: float = 1.2, prior_sd: float = 0.3, tau_floor: float = 0.15,
              passive_tau_floor: float = 0.03, min_checks: int = 3) -> FleetModel:  # fmt: skip
        """The model for NICs' link speeds (:func:`link_readings`, and jobs' passive readings:
        :mod:`.fleet_links`): one check or one job is one reading (a job's frames, correlated,
        count as one), speeds spread far more than compute times (a busy path, a shared
        switch), so the prior is wide, the floor of the spread high and the bar for "slow"
        20%."""
        return replace(self, link=True, flag_ratio=flag_ratio, prior_sd=prior_sd,
                       tau_floor=tau_floor, passive_tau_floor=passive_tau_floor, n_eff_cap=1,
                       min_jobs=min_checks)  # fmt: skip


@dataclass(slots=True)
class Health:
    """A part's pooled health."""

    jobs: int = 0  # jobs with a speed reading
    observed_s: float = 0.0
    slowness: float = 1.0  # posterior mean, as a ratio (1.06 = 6% slower than its peers)
    low: float = 1.0  # the interval's ends, as ratios
    high: float = 1.0
    sd: float = 0.0  # posterior sd of the log slowness
    incidents: float = 0.0  # decayed count
    incident_jobs: int = 0  # distinct jobs with an incident, after decay (weight >= 0.5)
    rate_per_h: float = 0.0  # shrunk incident rate per observed hour
    cost_s: float = 0.0  # job time lost to it
    slow: bool = False
    offender: bool = False
    reasons: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return self.slow or self.offender

    @property
    def score(self) -> float:
        """0..1, 1 = healthy: how much of its peers' speed the part keeps, less its incidents."""
        speed = 1.0 / self.slowness if self.slowness > 0 else 0.0
        return round(max(0.0, min(1.0, speed - (0.05 if self.offender else 0.0))), 4)


def tau_of(readings: Iterable[JobReading], model: FleetModel, floor: float | None = None) -> float:
    """The job-to-job spread of one healthy part's reading, from the whole fleet's readings
    (never below ``floor``, by default the model's ``tau_floor``)."""
    floor = model.tau_floor if floor is None else floor
    ys, vs = [], []
    for r in readings:
        if model.counts(r):
            ys.append(r.mean)
            vs.append(r.var / min(r.n, model.n_eff_cap))
    if len(ys) < 10:
        return floor
    y = np.asarray(ys)
    spread = 1.4826 * float(np.median(np.abs(y - np.median(y))))
    excess = spread**2 - float(np.median(vs))
    return max(floor, math.sqrt(excess) if excess > 0 else 0.0)


def taus_of(readings: Sequence[JobReading], model: FleetModel) -> tuple[float, float]:
    """``tau`` of a kind's readings, and of links' passive readings apart (their own spread,
    :attr:`FleetModel.passive_tau_floor`; for other kinds the same ``tau``)."""
    if not model.link:
        tau = tau_of(readings, model)
        return tau, tau
    checks = tau_of((r for r in readings if not model.passive(r)), model)
    jobs = tau_of((r for r in readings if model.passive(r)), model, model.passive_tau_floor)
    return checks, jobs


def speed(
    readings: Sequence[JobReading], tau: float, model: FleetModel, passive_tau: float | None = None
) -> tuple[float, float, int]:
    """Posterior ``(mean, sd)`` of a part's log slowness and the number of jobs counted
    (``passive_tau``: the spread of links' passive readings, by default ``tau``)."""
    prec = 1.0 / model.prior_sd**2
    acc = 0.0
    jobs = 0
    for r in readings:
        if not model.counts(r):
            continue
        t = passive_tau if passive_tau is not None and model.passive(r) else tau
        w = 1.0 / (max(r.var, 0.0) / min(r.n, model.n_eff_cap) + t**2)
        prec += w
        acc += w * r.mean
        jobs += 1
    return acc / prec, 1.0 / math.sqrt(prec), jobs


def decay(age_s: float, model: FleetModel) -> float:
    return 0.5 ** (max(age_s, 0.0) / model.half_life_s)


def health(
    readings: Sequence[JobReading],
    marks: Sequence[IncidentMark],
    *,
    now_s: float,
    tau: float,
    fleet_rate_per_h: float,
    model: FleetModel,
    passive_tau: float | None = None,
) -> Health:
    """One part's health from its readings and incidents, against the fleet's ``tau`` (links'
    passive readings: ``passive_tau``) and incident rate (``fleet_rate`` per observed hour)."""
    h = Health()
    mu, sd, h.jobs = speed(readings, tau, model, passive_tau)
    h.observed_s = sum(r.observed_s for r in readings)
    h.slowness, h.sd = math.exp(mu), sd
    h.low, h.high = math.exp(mu - model.z * sd), math.exp(mu + model.z * sd)
    if h.jobs >= max(1, model.min_jobs) and mu - model.z * sd > math.log(model.flag_ratio):
        h.slow = True
        what = f"{h.jobs} jobs"
        if model.link:  # link checks, and jobs whose own collectives could judge it
            jobs = sum(1 for r in readings if model.counts(r) and model.passive(r))
            what = " and ".join(
                f"{k} {w}" for k, w in ((jobs, "jobs"), (h.jobs - jobs, "link checks")) if k
            )
        h.reasons.append(
            f"{'links ' if model.link else ''}{(h.slowness - 1) * 100:.1f}% slower than its "
            f"peers over {what} (at least {(h.low - 1) * 100:.1f}%)"
        )
    weights: dict[str, float] = {}
    for m in marks:
        w = decay(now_s - m.at_s, model)
        h.incidents += w
        weights[m.job] = max(weights.get(m.job, 0.0), w)
        h.cost_s += m.lost_s
    h.incident_jobs = sum(1 for w in weights.values() if w >= 0.5)
    hours = h.observed_s / 3600.0
    h.rate_per_h = (h.incidents + fleet_rate_per_h * model.prior_hours) / (
        hours + model.prior_hours
    )
    if h.incident_jobs >= model.min_incident_jobs and h.rate_per_h > model.rate_factor * max(
        fleet_rate_per_h, 1e-9
    ):
        h.offender = True
        h.reasons.append(
            f"named by incidents in {h.incident_jobs} jobs ({h.rate_per_h:.2f}/h observed, "
            f"the fleet's {fleet_rate_per_h:.2f}/h)"
        )
    h.cost_s += speed_cost(h, readings, model, h.slowness)
    return h


def speed_cost(h: Health, readings: Sequence[JobReading], model: FleetModel, at: float) -> float:
    """The job time a part's slowness cost, were it ``at`` x slower than its peers: a GPU or
    host ``1 - 1/at`` of the time it ran (a straggler sets a synchronous job's pace); a NIC what
    its transfers lost in the jobs' passive readings (measured at its estimated slowness, scaled
    to ``at``: a link 30% slower does not make a job 30% slower)."""
    if not at > 1.0:
        return 0.0
    if not model.link:
        return (1.0 - 1.0 / at) * h.observed_s
    lost = sum(r.lost_s for r in readings if model.passive(r))
    if not (lost > 0 and h.slowness > 1.0):
        return 0.0
    return lost * min(1.0, (1.0 - 1.0 / at) / (1.0 - 1.0 / h.slowness))


@dataclass(frozen=True, slots=True)
class LinkCheck:
    """A finished set of link tests among hosts (a probe campaign of a job): what the fleet
    ledger reads NICs' speeds from."""

    id: str  # the campaign's: each check is one reading of the NICs it measured
    job: str
    pairs: tuple[tuple[str, str, float], ...]  # (a, b, bytes per second) measured
    reference: float  # the fast pairs' speed the campaign judged them against
    at_ns: int


def link_readings(
    pairs: Iterable[tuple[str, str, float]], reference: float
) -> dict[str, float]:
    """Per host, a link check's reading: ``log(reference / best)``, ``best`` the fastest of its
    measured pairs (bytes per second; > 0: slower than the reference). A slow NIC makes every
    pair through it slow, a healthy host has a fast one, so only hosts in two or more measured
    pairs get a reading: one pair cannot say which end is slow."""
    best: dict[str, float] = {}
    count: dict[str, int] = {}
    for a, b, bps in pairs:
        if not (bps > 0 and math.isfinite(bps)):
            continue
        for h in (a, b):
            best[h] = max(best.get(h, 0.0), bps)
            count[h] = count.get(h, 0) + 1
    if not (reference > 0 and math.isfinite(reference)):
        return {}
    return {h: math.log(reference / v) for h, v in best.items() if count[h] >= 2}


def fleet_rate(marks: int | float, observed_s: float) -> float:
    """The fleet's incident rate per observed part-hour (one pseudo-incident per 1000 h)."""
    return (marks + 1.0) / (observed_s / 3600.0 + 1000.0)


class SpeedTally:
    """Per slot of a running job: the sums of per-frame log compute ratios since last drained
    (what the fleet ledger takes from a detection pass; bounded by the job's size)."""

    __slots__ = ("n", "s1", "s2", "seconds")

    def __init__(self, slots: int = 0) -> None:
        self.n = np.zeros(slots, dtype=np.int64)
        self.s1 = np.zeros(slots)
        self.s2 = np.zeros(slots)
        self.seconds = np.zeros(slots)

    def add(self, compute_ratio: np.ndarray, frame_s: float) -> None:
        """One frame's compute ratios (NaN: no reading for that slot)."""
        size = compute_ratio.size
        if size > self.n.size:
            grow = size - self.n.size
            self.n = np.concatenate([self.n, np.zeros(grow, dtype=np.int64)])
            self.s1, self.s2, self.seconds = (
                np.concatenate([a, np.zeros(grow)]) for a in (self.s1, self.s2, self.seconds)
            )
        ok = np.isfinite(compute_ratio) & (compute_ratio > 0)
        if not ok.any():
            return
        idx = np.flatnonzero(ok)
        y = np.log(compute_ratio[idx])
        self.n[idx] += 1
        self.s1[idx] += y
        self.s2[idx] += y * y
        if math.isfinite(frame_s) and frame_s > 0:
            self.seconds[idx] += frame_s

    def reading(self, slot: int) -> JobReading | None:
        if slot >= self.n.size or self.n[slot] == 0:
            return None
        n = int(self.n[slot])
        mean = float(self.s1[slot]) / n
        var = max(0.0, float(self.s2[slot]) / n - mean * mean)
        return JobReading(n=n, mean=mean, var=var, observed_s=float(self.seconds[slot]))


def merge(a: JobReading, b: JobReading) -> JobReading:
    """Two readings of one part in one job (or an archive of old jobs) pooled into one."""
    n = a.n + b.n
    observed, lost = a.observed_s + b.observed_s, a.lost_s + b.lost_s
    if n == 0:
        return JobReading(0, 0.0, 0.0, observed, lost)
    mean = (a.n * a.mean + b.n * b.mean) / n
    m2 = a.n * (a.var + a.mean**2) + b.n * (b.var + b.mean**2)
    return JobReading(n, mean, max(0.0, m2 / n - mean**2), observed, lost)


def pooled(readings: Sequence[JobReading]) -> JobReading:
    """Readings of several parts in one job (a host's GPUs) as one: their mean, per frame."""
    use = [r for r in readings if r.n > 0]
    if not use:
        return JobReading(0, 0.0, 0.0, 0.0)
    k = len(use)
    return JobReading(
        n=min(r.n for r in use),
        mean=sum(r.mean for r in use) / k,
        var=sum(r.var for r in use) / k / k,
        observed_s=max(r.observed_s for r in use),
    )
