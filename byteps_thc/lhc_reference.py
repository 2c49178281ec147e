"""byteps_thc.lhc_reference: the former name of byteps_thc.lhc.reference, the same module object."""
import sys

from .lhc import reference

sys.modules[__name__] = reference
