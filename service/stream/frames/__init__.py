"""Frames: per-step, per-rank signals built from step records and completed collectives."""

from failslow.service.stream.frames.accumulator import NEVER
from failslow.service.stream.frames.builder import FrameBuilder

__all__ = ["NEVER", "FrameBuilder"]
