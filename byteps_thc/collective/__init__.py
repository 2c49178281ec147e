"""The THC collective over torch.distributed, shared by the DDP hook and FSDP's reduce-scatter.

geometry.py lays out a partition (rotation block, shards, per-partition seed); rounds.py has the
steps every round shares: the norm round, the encode into one payload, the all_to_all and the
integer sum of this rank's share (its module docstring). byteps_thc.ddp and byteps_thc.fsdp add
what differs: DDP gathers the sums and decodes the whole bucket, FSDP decodes its own shard.
"""
from . import geometry, rounds

__all__ = ["geometry", "rounds"]
