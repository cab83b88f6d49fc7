"""failslow agents: the in-process SDK a training script calls, and the node agent.

    from failslow.agents import Recorder
    rec = Recorder("my-job")                  # talks to the local agent's socket
    rec.register_rank(0, gpu=0, world_size=8)
    rec.register_comm("dp-0", "dp", [0, 1, 2, 3, 4, 5, 6, 7])
    with rec.step(rank=0, step=12):
        with rec.collective(rank=0, comm="dp-0", seq=41, op="allreduce", nbytes=1 << 28):
            ...

Nothing here imports the service. Nothing here raises into the training loop.
"""

from failslow.agents.sdk import Recorder, configure, recorder


def record_collective(**kwargs: object) -> None:
    """Record one collective on the process-wide recorder (see :func:`configure`)."""
    recorder().record_collective(**kwargs)  # type: ignore[arg-type]


def record_step(**kwargs: object) -> None:
    """Record one training step on the process-wide recorder."""
    recorder().record_step(**kwargs)  # type: ignore[arg-type]


__all__ = ["Recorder", "configure", "record_collective", "record_step", "recorder"]
