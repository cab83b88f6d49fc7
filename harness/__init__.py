"""failslow's harness: the simulator, the fault lab, the demo and replay.

Tools that drive a failslow service from outside (over HTTP, or through node agents they start),
used by the ``failslow`` CLI, the evaluation (``bench/eval``) and the tests. Nothing in the agents'
runtime or the service imports it.
"""
