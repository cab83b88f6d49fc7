import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from failslow.detectors.lateness import collective_lateness


def test_last_arriver_has_the_shortest_duration_and_all_the_lateness() -> None:
    # Members arrive at 0, 0, 0, 30 ms; all leave at 31 ms (1 ms of transfer).
    starts = np.array([0.0, 0.0, 0.0, 30.0])
    durations = 31.0 - starts
    late, wait = collective_lateness(durations)
    assert late[0].tolist() == [0.0, 0.0, 0.0, 30.0]
    assert wait[0].tolist() == [30.0, 30.0, 30.0, 0.0]


def test_pair_lateness_is_the_full_difference() -> None:
    late, wait = collective_lateness(np.array([[5.0, 1.0]]))
    assert late.tolist() == [[0.0, 4.0]]
    assert wait.tolist() == [[4.0, 0.0]]


@given(
    st.lists(st.floats(0.0, 100.0), min_size=2, max_size=16),
    st.lists(st.floats(-5.0, 5.0), min_size=16, max_size=16),
)
def test_lateness_is_independent_of_clock_offsets(
    arrivals: list[float], offsets: list[float]
) -> None:
    """Durations are taken on each host's own clock: shifting a host's clock changes nothing."""
    a = np.array(arrivals)
    exit_t = a.max() + 1.0
    true = exit_t - a
    shifted = (exit_t + np.array(offsets[: a.size])) - (a + np.array(offsets[: a.size]))
    np.testing.assert_allclose(
        collective_lateness(true)[0], collective_lateness(shifted)[0], atol=1e-9
    )


def test_rows_are_independent() -> None:
    d = np.array([[10.0, 10.0, 2.0], [3.0, 9.0, 9.0]])
    late, _ = collective_lateness(d)
    assert late[0].tolist() == [0.0, 0.0, 8.0]
    assert late[1].tolist() == [6.0, 0.0, 0.0]
