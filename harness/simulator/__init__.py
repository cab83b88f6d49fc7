"""Discrete-event simulator of a TP x PP x DP training job, with noise and labelled faults.

Used by ``failslow simulate``, ``make demo``, the tests and the evaluation harness. It emits the
same v1 records a real agent would, from each host's own (slightly offset) clock.
"""

from failslow.harness.simulator.engine import Simulation
from failslow.harness.simulator.faults import Fault
from failslow.harness.simulator.layout import Layout
from failslow.harness.simulator.scenario import Scenario

__all__ = ["Fault", "Layout", "Scenario", "Simulation"]
