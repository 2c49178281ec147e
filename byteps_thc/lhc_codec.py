"""byteps_thc.lhc_codec: the former name of byteps_thc.lhc.codec, the same module object."""
import sys

from .lhc import codec

sys.modules[__name__] = codec
