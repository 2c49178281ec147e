"""`python -m byteps_thc.launch ...` is bpslaunch."""
import sys

from . import main

sys.exit(main())
