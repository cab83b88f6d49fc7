"""PyTorch's own distributed test suite, driven as PyTorch's ``test_distributed_spawn.py`` drives
it (the suite ships in the wheel: ``torch/testing/_internal/distributed/distributed_test.py``).

Not collected by ``make test`` on its own (its name does not start with ``test_``):
``tests/compat/run_suite.py`` runs it with ``BACKEND``, ``WORLD_SIZE`` and ``TEMP_DIR`` set,
once plain and once with failslow instrumenting every rank it spawns (``failslow run``'s
environment), and compares the outcomes test by test.
"""

import os

import torch
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

assert os.environ.get("BACKEND"), "run through tests/compat/run_suite.py"


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


if __name__ == "__main__":
    run_tests()
