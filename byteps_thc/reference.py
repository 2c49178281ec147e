"""byteps_thc.reference: the former name of byteps_thc.thc.reference, the same module object."""
import sys

from .thc import reference

sys.modules[__name__] = reference
