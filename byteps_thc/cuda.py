"""byteps_thc.cuda: the former name of byteps_thc.thc.cuda, the same module object."""
import sys

from .thc import cuda

sys.modules[__name__] = cuda
