"""`python -m byteps_thc.advisor`: the advisor's command line (byteps_thc.advisor.cli)."""
import sys

from .cli import main

sys.exit(main())
