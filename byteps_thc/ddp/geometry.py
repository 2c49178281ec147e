"""The bucket layout rules, which live in the shared THC collective (byteps_thc.collective)."""
from ..collective.geometry import *  # noqa: F403  (re-exported: the hook's layout rules)
from ..collective.geometry import __all__  # noqa: F401  (re-exported)
