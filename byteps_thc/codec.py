"""byteps_thc.codec: the former name of byteps_thc.thc.codec, the same module object."""
import sys

from .thc import codec

sys.modules[__name__] = codec
