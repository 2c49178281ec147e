"""`python -m byteps_thc.stackcost`: runs `python -m byteps_thc.advisor.calibrate`."""
import sys

from ..advisor.calibrate import main

print("byteps_thc.stackcost is now byteps_thc.advisor.calibrate "
      "(python -m byteps_thc.advisor.calibrate)", file=sys.stderr)
sys.exit(main())
