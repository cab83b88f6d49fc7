"""A DDP comm hook that does what DDP's default hook does and times each bucket's all-reduce
(for code that needs a comm hook; :func:`~failslow.agents.torch.process_group.timed_group` is
cheaper)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from failslow.agents.torch.timing import CallTimer, group_ranks, nbytes_of
from failslow.detectors.vocab import CommKind, Op


def ddp_hook(
    inst: CallTimer, name: str = "dp", kind: str = CommKind.DP, group: Any = None
) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
    """A DDP comm hook doing what DDP's default does (scale the bucket by 1 / group size,
    all-reduce it) and timing each bucket's all-reduce. Use it as
    ``ddp.register_comm_hook(None, instrumentation.ddp_hook())``.

    DDP's reducer multiplies by the reciprocal (``at::mul(grad, 1.0 / div_factor)``);
    dividing instead, as PyTorch's own ``allreduce_hook`` does, rounds differently when the
    group size is not a power of two, and training would no longer be bit-identical."""
    inst.recorder.register_comm(name, kind, group_ranks(group))  # its own id: DDP's buckets only
    all_reduce = inst._originals.get("all_reduce", dist.all_reduce)
    size = dist.get_world_size(group)

    def hook(_state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:  # noqa: D401
        tensor = bucket.buffer()
        tensor.mul_(1.0 / size)
        seq = inst._next(name)
        nbytes = nbytes_of(tensor)
        start = inst.clock()
        inst._begin(name, seq, Op.ALLREDUCE, nbytes, start, None)
        event = inst._event_start(tensor)
        fut = all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            # on CUDA, PyTorch runs this with a current stream that waits for the all-reduce
            inst._complete(name, seq, Op.ALLREDUCE, nbytes, start, None, event)
            return f.value()[0]

        return fut.then(done)

    # DDP checks the annotations as objects (this module's are strings)
    hook.__annotations__ = {
        "_state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook
