"""The former name of the advisor's command line, kept so that `python -m byteps_thc.advise`
still works: it runs `python -m byteps_thc.advisor` (byteps_thc/advisor/). Nothing imports it."""
import sys

from .advisor.cli import main

if __name__ == "__main__":
    print("byteps_thc.advise is now byteps_thc.advisor (python -m byteps_thc.advisor)",
          file=sys.stderr)
    sys.exit(main())
