"""byteps_thc.lhc_config: the former name of byteps_thc.lhc.config, the same module object."""
import sys

from .lhc import config

sys.modules[__name__] = config
