"""The training examples. Each runs as a script, by path (`python example/pytorch/train_digits.py`,
under `bpslaunch` or `torchrun`), and imports what the examples share as `from example import
common`: the repository root is on sys.path through the virtual environment's .pth
(scripts/venv.sh; the Docker image and MXNet's environment write the same), as it is for
byteps_thc. The framework folders hold scripts, not subpackages.
"""
