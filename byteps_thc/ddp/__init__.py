"""THC for torch.distributed: a DDP communication hook, no parameter server.

    from byteps_thc.ddp import ThcHookState, thc_hook
    model.register_comm_hook(ThcHookState(), thc_hook)

hook.py has the algorithm (the module docstring), state.py the state and its state_dict; the
bucket layout (rotation block, shards, per-bucket seed) and the steps the hook shares with FSDP
are byteps_thc.collective's.
"""
from .hook import thc_hook
from .state import ThcHookState, default_config

__all__ = ["ThcHookState", "thc_hook", "default_config"]
