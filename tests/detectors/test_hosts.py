import numpy as np

from failslow.detectors.hosts import host_outlier_scores


def test_robust_covariance_names_the_odd_host_among_many() -> None:
    rng = np.random.default_rng(0)
    feats = np.column_stack([rng.normal(1.0, 0.01, 40), rng.normal(0.0, 0.002, 40), np.zeros(40)])
    feats[7] = [1.4, 0.1, 0.0]
    feats[30] = [1.3, 0.08, 0.0]  # two bad hosts cannot hide each other
    dist, p = host_outlier_scores(feats)
    assert set(np.argsort(-dist)[:2].tolist()) == {7, 30}
    assert p[7] < 1e-6 and np.median(p) > 0.05


def test_few_hosts_use_robust_z_and_missing_rows_are_nan() -> None:
    feats = np.array([[1.0, 0.0], [1.01, 0.001], [0.99, 0.0], [1.5, 0.2], [np.nan, 0.0]])
    dist, _ = host_outlier_scores(feats)
    assert int(np.nanargmax(dist)) == 3 and np.isnan(dist[4])


def test_identical_hosts_are_not_outliers() -> None:
    dist, p = host_outlier_scores(np.ones((12, 3)))
    assert (dist == 0).all() and (p == 1).all()
