"""A DDP comm hook with the arithmetic of DDP's default one, for code that wants a comm hook.

Not needed for timing: DDP's gradient all-reduces are timed below the Python API whatever hook
or group DDP uses (:mod:`~failslow.agents.torch.dispatch`). Any Python comm hook costs more than
none (an extra pass over every bucket for the scaling, a Python future per bucket)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def ddp_hook(group: Any = None) -> Callable[[Any, Any], torch.futures.Future[torch.Tensor]]:
    """A DDP comm hook doing what DDP's default does: scale the bucket by 1 / group size and
    all-reduce it. Use it as ``ddp.register_comm_hook(None, ddp_hook())``.

    DDP's reducer multiplies by the reciprocal (``at::mul(grad, 1.0 / div_factor)``); dividing
    instead, as PyTorch's own ``allreduce_hook`` does, rounds differently when the group size is
    not a power of two, and training would no longer be bit-identical."""
    size = dist.get_world_size(group)

    def hook(_state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:  # noqa: D401
        tensor = bucket.buffer()
        tensor.mul_(1.0 / size)
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    # DDP checks the annotations as objects (this module's are strings)
    hook.__annotations__ = {
        "_state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook
