"""byteps_thc.config: the former name of byteps_thc.thc.config, the same module object."""
import sys

from .thc import config

sys.modules[__name__] = config
