"""What both synthetic scripts take and do alike: upstream's benchmark flags (and the MLP's shape
that tests/cluster/test_compressor_flag.py counts on, with its own constants), and printing on
rank 0 only. Plain argparse and print: like the scripts, it knows nothing of byteps-thc.
"""
import argparse


def parser(description):
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-pushpull", action="store_true", default=False,
                   help="use fp16 compression during push_pull")
    p.add_argument("--batch-size", type=int, default=16, help="input batch size")
    p.add_argument("--input-size", type=int, default=1024, help="features per sample")
    p.add_argument("--hidden", type=int, default=512, help="width of the hidden layers")
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=3)
    return p


def rank0_log(bps):
    """print(s) on rank 0 of `bps` (byteps.torch or byteps.tensorflow), nothing elsewhere."""
    def log(s):
        if bps.rank() == 0:
            print(s, flush=True)
    return log
