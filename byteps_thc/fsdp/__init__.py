"""THC for FSDP2: a homomorphic reduce-scatter for stock torch's
`fully_shard(module).set_custom_reduce_scatter(comm)`, no parameter server, no patched torch.

    from byteps_thc.fsdp import ThcReduceScatter
    fully_shard(module).set_custom_reduce_scatter(ThcReduceScatter(key=0))

reduce_scatter.py has the algorithm (its module docstring); docs/FSDP.md the memory and tuning.
"""
from .reduce_scatter import EF_MODES, ThcReduceScatter

__all__ = ["ThcReduceScatter", "EF_MODES"]
