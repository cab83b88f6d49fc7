"""The operators of c10d that carry communication, as PyTorch's dispatcher sees them.

Every way a PyTorch program communicates — ``torch.distributed``'s functions however they are
reached, ``P2POp``/``batch_isend_irecv``, the coalescing manager, functional collectives
(DTensor, FSDP2, ``torch.compile``'d graphs), ``torch.distributed.pipelining``, DDP's C++
reducer — ends in one call of one of these ``c10d::`` operators through the dispatcher
(``ProcessGroup::allreduce`` and its siblings dispatch them). Each entry says where the
operator's arguments hold the process group, the payload whose size is reported, and, for
point-to-point operators, the peer (a rank *within* the group).

``gather`` is reported as ``reduce`` and ``scatter`` as ``broadcast``: the API's op vocabulary
has neither, and each moves data to or from one root as its counterpart does.
"""

from __future__ import annotations

from dataclasses import dataclass

from failslow.detectors.vocab import Op


@dataclass(frozen=True, slots=True)
class OpSpec:
    name: str  # the operator in the c10d namespace
    op: Op
    group: int  # argument index of the ProcessGroup
    payload: int | None  # argument index of the tensors whose bytes are reported
    peer: int | None = None  # argument index of the peer's group rank (send/recv)
    returns_work: bool = True  # False: synchronous, returns nothing


SPECS: tuple[OpSpec, ...] = (
    OpSpec("allreduce_", Op.ALLREDUCE, 1, 0),
    OpSpec("allreduce_coalesced_", Op.ALLREDUCE, 1, 0),
    OpSpec("allgather_", Op.ALLGATHER, 2, 1),
    OpSpec("_allgather_base_", Op.ALLGATHER, 2, 1),
    OpSpec("allgather_coalesced_", Op.ALLGATHER, 2, 1),
    OpSpec("allgather_into_tensor_coalesced_", Op.ALLGATHER, 2, 1),
    OpSpec("reduce_scatter_", Op.REDUCESCATTER, 2, 1),
    OpSpec("_reduce_scatter_base_", Op.REDUCESCATTER, 2, 1),
    OpSpec("reduce_scatter_tensor_coalesced_", Op.REDUCESCATTER, 2, 1),
    OpSpec("alltoall_", Op.ALLTOALL, 2, 1),
    OpSpec("alltoall_base_", Op.ALLTOALL, 2, 1),
    OpSpec("broadcast_", Op.BROADCAST, 1, 0),
    OpSpec("reduce_", Op.REDUCE, 1, 0),
    OpSpec("gather_", Op.REDUCE, 2, 1),
    OpSpec("scatter_", Op.BROADCAST, 2, 0),
    OpSpec("barrier", Op.BARRIER, 1, None),
    OpSpec("monitored_barrier_", Op.BARRIER, 1, None, returns_work=False),
    OpSpec("send", Op.SEND, 1, 0, peer=2),
    OpSpec("recv_", Op.RECV, 1, 0, peer=2),
)

# Seen but not recorded: the peer of a receive from any source is known only afterwards.
UNATTRIBUTED = ("recv_any_source_",)
