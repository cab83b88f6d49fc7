"""Online change-point detection: Bayesian online change-point detection, confirmed by ruptures.

* :class:`BOCPD` is Adams & MacKay (2007), "Bayesian Online Changepoint Detection", with a
  conjugate Normal-Gamma model (Student-t predictive), a constant hazard and run-length pruning
  to a fixed capacity (mass beyond it is merged into the oldest slot), vectorised over many
  series at once. It notices a change within a few samples and says how long ago it happened.
* :class:`OnlineChangeDetector` turns one series' BOCPD alarms into confirmed change points: a
  few samples after an alarm it segments a bounded window with ruptures' binary segmentation
  (``jump=1``, explicit ``min_size`` and a BIC-like penalty on the window's own scale) and keeps
  a change only if a step explains its neighbourhood at least as well as a straight line does,
  so drifts and random walks are not cut into steps. Change points inside the window may be
  re-dated by later confirmations; older ones are final.
* :func:`find_change_points` replays a whole series through the detector at its defaults.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import ruptures as rpt
from scipy.special import gammaln

from failslow.detectors.robust import quiet_nan

LOG_ZERO = -np.inf


class BOCPD:
    """Vectorised BOCPD over ``n_series`` series (one value per series per update)."""

    def __init__(
        self,
        n_series: int,
        *,
        hazard: float = 1 / 100,
        max_run: int = 128,
        kappa0: float = 0.01,
        alpha0: float = 1.0,
    ) -> None:
        if not 0 < hazard < 1 or max_run < 2:
            raise ValueError("need 0 < hazard < 1 and max_run >= 2")
        self.n = n_series
        self.r = max_run
        self.log_h = float(np.log(hazard))
        self.log_1h = float(np.log1p(-hazard))
        self.kappa0 = kappa0
        self.alpha0 = alpha0
        shape = (n_series, max_run)
        self.log_r = np.full(shape, LOG_ZERO)  # log P(run length = slot | data)
        self.mu = np.zeros(shape)
        self.kappa = np.full(shape, kappa0)
        self.alpha = np.full(shape, alpha0)
        self.beta = np.ones(shape)
        self.beta0 = np.ones(n_series)  # prior scale per series, set from its first two values
        self.run = np.zeros(shape, dtype=np.int64)  # run length held by each slot
        self.count = np.zeros(n_series, dtype=np.int64)
        self.first = np.zeros(n_series)

    def update(self, x: np.ndarray) -> None:
        """Observe one value per series; NaN leaves that series unchanged."""
        x = np.asarray(x, dtype=np.float64)
        ok = np.isfinite(x)
        fresh = ok & (self.count == 0)
        if fresh.any():  # a series' first value opens run 0 with the prior centred on it
            self.log_r[fresh] = LOG_ZERO
            self.log_r[fresh, 0] = 0.0
            self.mu[fresh, 0] = x[fresh]
            self.first[fresh] = x[fresh]
        second = ok & (self.count == 1)
        if second.any():  # prior scale: the first difference (a floor keeps it positive)
            d = np.abs(x[second] - self.first[second])
            floor = np.maximum(np.abs(self.first[second]) * 1e-3, 1e-12)
            b0 = np.maximum(d, floor) ** 2
            self.beta0[second] = b0
            self.beta[second] = b0[:, None]
        step = ok & (self.count >= 1)
        self.count[ok] += 1
        if not step.any():
            return
        rows = np.flatnonzero(step)
        xs = x[rows][:, None]
        mu, ka, al, be = self.mu[rows], self.kappa[rows], self.alpha[rows], self.beta[rows]
        df = 2.0 * al
        var = be * (ka + 1.0) / (al * ka)
        lp = (
            gammaln((df + 1.0) / 2.0)
            - gammaln(df / 2.0)
            - 0.5 * np.log(np.pi * df * var)
            - (df + 1.0) / 2.0 * np.log1p((xs - mu) ** 2 / (df * var))
        )
        joint = self.log_r[rows] + lp
        cp = np.logaddexp.reduce(joint, axis=1) + self.log_h
        grown = joint + self.log_1h
        new = np.empty_like(joint)
        new[:, 0] = cp
        new[:, 1:] = grown[:, :-1]
        new[:, -1] = np.logaddexp(new[:, -1], grown[:, -1])  # the tail keeps the oldest mass
        new -= np.logaddexp.reduce(new, axis=1)[:, None]
        mu_n = (ka * mu + xs) / (ka + 1.0)
        be_n = be + ka * (xs - mu) ** 2 / (2.0 * (ka + 1.0))
        self.log_r[rows] = new
        self.mu[rows, 1:] = mu_n[:, :-1]
        self.kappa[rows, 1:] = ka[:, :-1] + 1.0
        self.alpha[rows, 1:] = al[:, :-1] + 0.5
        self.beta[rows, 1:] = be_n[:, :-1]
        run = self.run[rows]
        self.run[rows, 1:] = run[:, :-1] + 1
        self.run[rows, 0] = 0
        # the new run's prior is centred on the value that opened it
        self.mu[rows, 0] = x[rows]
        self.kappa[rows, 0] = self.kappa0
        self.alpha[rows, 0] = self.alpha0
        self.beta[rows, 0] = self.beta0[rows]

    def map_run(self) -> np.ndarray:
        """Most probable current run length per series."""
        return self.run[np.arange(self.n), np.argmax(self.log_r, axis=1)]

    def recent_change_probability(self, within: int) -> np.ndarray:
        """P(a change happened within the last ``within`` samples) per series. The run that
        started with the series itself is not a change, however young it is."""
        p = np.exp(self.log_r)
        since_start = self.run >= (self.count[:, None] - 1)
        return np.where((self.run <= within) & ~since_start, p, 0.0).sum(axis=1)


def _rss_line(y: np.ndarray) -> float:
    t = np.arange(y.size, dtype=np.float64)
    a = np.vstack([t, np.ones_like(t)]).T
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(((a @ coef - y) ** 2).sum())


def _rss_step(y: np.ndarray, k: int) -> float:
    a, b = y[:k], y[k:]
    return float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum())


def hampel(values: np.ndarray, *, half: int = 3, k: float = 4.0) -> np.ndarray:
    """Replace isolated outliers by the median of their neighbourhood (Hampel filter).

    A point is an outlier when it is more than ``k`` noise scales away from the median of the
    ``2 * half + 1`` points around it; the noise scale is the MAD of first differences, so a
    level shift (many points) is never an outlier, but a checkpoint stall or a spike is.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2 * half + 1:
        return x
    d = np.diff(x)
    scale = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2.0)
    if scale <= 0:
        return x
    # Reflect at the edges: with edge padding a spike in the newest sample would outvote its
    # neighbours; a 7-point median tolerates three outliers, i.e. two adjacent ones at an edge.
    padded = np.pad(x, half, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    med = np.median(windows, axis=1)
    out = x.copy()
    bad = np.abs(x - med) > k * scale
    out[bad] = med[bad]
    return out


def segment_window(values: np.ndarray, *, min_size: int, penalty: float) -> list[int]:
    """Change points of one window: Hampel-filtered, then binary segmentation (ruptures, l2,
    ``jump=1``) with penalty ``penalty * log(n)`` on the window standardised by its own spread,
    then the trend test."""
    w = np.asarray(values, dtype=np.float64)
    if w.size < 2 * min_size + 1:
        return []
    if np.isnan(w).any():
        w = np.where(np.isnan(w), quiet_nan(np.nanmedian, w), w)
    w = hampel(w)
    s = float(np.std(w))
    if s <= 0:
        return []
    z = ((w - w.mean()) / s).reshape(-1, 1)
    algo = rpt.Binseg(model="l2", min_size=min_size, jump=1).fit(z)
    bkps = [b for b in algo.predict(pen=penalty * np.log(w.size)) if b < w.size]
    bounds = [0, *bkps, w.size]
    kept = []
    for i, cp in enumerate(bkps):
        lo, hi = bounds[i], bounds[i + 2]
        y = w[lo:hi]
        if _rss_line(y) >= _rss_step(y, cp - lo):
            kept.append(cp)
    return kept


@dataclass(frozen=True, slots=True)
class ChangePoint:
    index: int  # first sample of the new segment
    before: float  # mean of the segment before (within the window)
    after: float  # mean of the segment after


class OnlineChangeDetector:
    """One series: BOCPD alarms, confirmed and dated by ruptures on a bounded window."""

    def __init__(
        self,
        *,
        hazard: float = 1 / 100,
        max_run: int = 128,
        alarm_probability: float = 0.3,
        alarm_within: int = 5,
        confirm_after: int = 5,
        window: int = 1000,
        min_size: int = 5,
        penalty: float = 3.0,
    ) -> None:
        if confirm_after < 1 or window < 2 * min_size + 1:
            raise ValueError("need confirm_after >= 1 and window > 2 * min_size")
        self.bocpd = BOCPD(1, hazard=hazard, max_run=max_run)
        self.alarm_probability = alarm_probability
        self.alarm_within = alarm_within
        self.confirm_after = confirm_after
        self.min_size = min_size
        self.penalty = penalty
        self.values: deque[float] = deque(maxlen=window)
        self.t = 0  # samples seen
        self.pending: int | None = None  # sample index of the first unconfirmed alarm
        self.attempt = 0  # confirmation attempts for the pending alarm
        self.max_attempts = 2  # after confirm_after and 2 x confirm_after samples
        self.points: list[ChangePoint] = []
        self.confirmations = 0

    @property
    def change_points(self) -> list[int]:
        return [p.index for p in self.points]

    def alarm(self) -> bool:
        """BOCPD believes a change happened within the last ``alarm_within`` samples."""
        p = float(self.bocpd.recent_change_probability(self.alarm_within)[0])
        run = int(self.bocpd.map_run()[0])
        return (
            p >= self.alarm_probability
            and run <= self.alarm_within
            and run < self.bocpd.count[0] - 1
        )

    def update(self, value: float) -> list[ChangePoint]:
        """Observe one sample; returns change points confirmed (or re-dated) by it."""
        v = float(value)
        self.values.append(v)
        self.bocpd.update(np.array([v]))
        t = self.t
        self.t += 1
        if not np.isfinite(v):
            return []
        if self.bocpd.count[0] > 2 and self.alarm() and self.pending is None:
            self.pending, self.attempt = t, 0
        if self.pending is not None and t - self.pending >= self.confirm_after << self.attempt:
            # A change needs enough samples after it to stand out: retry at doubling delays
            # until one near the alarm is confirmed, or give up.
            alarm = self.pending
            found = self._confirm()
            near = any(
                abs(p.index - alarm) <= self.confirm_after + self.min_size for p in self.points
            )
            self.attempt += 1
            if near or self.attempt >= self.max_attempts:
                self.pending = None
            return found
        return []

    def flush(self) -> list[ChangePoint]:
        """Confirm an alarm still pending at the end of a series."""
        if self.pending is None:
            return []
        self.pending = None
        return self._confirm()

    def _confirm(self) -> list[ChangePoint]:
        self.confirmations += 1
        w = np.fromiter(self.values, dtype=np.float64, count=len(self.values))
        lo = self.t - w.size  # sample index of w[0]
        found = segment_window(w, min_size=self.min_size, penalty=self.penalty)
        bounds = [0, *found, w.size]
        fresh = [
            ChangePoint(
                lo + cp,
                float(quiet_nan(np.nanmean, w[bounds[i] : cp])),
                float(quiet_nan(np.nanmean, w[cp : bounds[i + 2]])),
            )
            for i, cp in enumerate(found)
        ]
        # Once the window slides, its oldest quarter was judged by earlier confirmations and is
        # final; the rest is re-decided (re-dated, dropped or added) by this one.
        settled = lo + self.values.maxlen // 4 if lo > 0 else 0  # type: ignore[operator]
        final = [p for p in self.points if p.index < settled]
        known = {p.index for p in self.points}
        fresh = [p for p in fresh if p.index >= settled]
        self.points = final + fresh
        return [p for p in fresh if p.index not in known]


def find_change_points(values: np.ndarray | list[float], **params: float) -> list[int]:
    """Replay ``values`` through :class:`OnlineChangeDetector` (production defaults unless
    overridden) and return the indices of the first samples of new segments."""
    det = OnlineChangeDetector(**params)  # type: ignore[arg-type]
    for v in np.asarray(values, dtype=np.float64):
        det.update(v)
    det.flush()
    return det.change_points
