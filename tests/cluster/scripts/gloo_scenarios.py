"""The entry point that the torch.distributed worker scripts share: `SCRIPT SCENARIO OUT ARGS...`
under torchrun-style variables (MASTER_ADDR, RANK, WORLD_SIZE...), one gloo process group per
run, the scenario called as `fn(rank, world_size, out, *args)`."""
import datetime
import sys

import torch
import torch.distributed as dist


def main(scenarios):
    if len(sys.argv) < 3 or sys.argv[1] not in scenarios:
        raise SystemExit(f"usage: {sys.argv[0]} {{{','.join(scenarios)}}} OUT [ARGS...]; "
                         f"got {sys.argv[1:]!r}")
    scenario, out, *args = sys.argv[1:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    scenarios[scenario](dist.get_rank(), dist.get_world_size(), out, *args)
    dist.destroy_process_group()
