"""byteps_thc.tables: the former name of byteps_thc.thc.tables, the same module object."""
import sys

from .thc import tables

sys.modules[__name__] = tables
