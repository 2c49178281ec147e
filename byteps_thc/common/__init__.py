"""What the codec packages (byteps_thc.thc, byteps_thc.lhc) share, written once, as
csrc/common/ is for their C++ cores: the hashes (`hashes`, the NumPy twin of csrc/common/hash.h),
the checks of what a codec is given (`inputs`) and the environment form of a codec's
configuration (`settings`). It imports neither codec.
"""
