"""The former name of the advisor's calibration clusters, now byteps_thc.advisor.calibrate.

Only `python -m byteps_thc.stackcost` is kept (it says where to go and runs the new module);
nothing imports this package.
"""
