"""How the C++ codec cores are compiled: the one description every build of them reads.

Readers: setup.py (byteps_thc._C), csrc/thc/cuda/build.py (the CUDA twins, through setup.py),
the BytePS fork build (csrc/byteps/src/byteps_thc_build.py; scripts/build_byteps.sh copies this
file beside it, to the root of the sdist's tree), the cluster tests' ps-lite client
(tests/cluster/client/thc_cluster.py) and the CUDA emulation of tests/unit/test_cuda.py.
Standard library only and no imports of ours: the fork build imports it inside the sdist's
setup.py, where neither the venv's packages nor byteps_thc need be importable.

Every kernel must give the bits of its reference (byteps_thc/reference.py, docs/ALGORITHM.md)
whichever build compiled it; the flags below are the ones that keep it so, and each says why.
"""
import os
import platform

# The codec cores, each a folder of csrc/ with its own kernel table (dispatch.cc), and the
# header-only folder both include (csrc/common; "common/hash.h").
CORES = ("thc", "lhc")
SHARED = "common"

# ---- flags -----------------------------------------------------------------------------------
# What the core's code needs of the language.
STD = ["-std=c++17"]
# The optimisation level. Given after BytePS's own flags in the fork build, the last -O wins:
# BytePS's -Ofast would also turn on -ffast-math and -fallow-store-data-races (stores the source
# does not make, which a kernel's threads could race on: csrc/thc/parallel.h).
OPT = ["-O3"]
# The floating-point rules: the kernels round every product and every sum as the reference does.
FP = [
    # IEEE semantics (no reassociation, reciprocals, finite-math or flush-to-zero assumptions);
    # the default, spelled out because the fork build's BytePS flags say -Ofast.
    "-fno-fast-math",
    # sqrt and friends inline, without an errno branch: the same correctly rounded results (errno
    # is never read). After -fno-fast-math, which would turn math-errno back on.
    "-fno-math-errno",
    # no fused a*b+c: an FMA rounds once where the reference rounds twice (docs/ALGORITHM.md).
    "-ffp-contract=off",
]
# Every compile of core code: a codec file, or one of ours that includes the cores' headers.
CODEC = STD + OPT + FP

# A file's instruction set is the suffix of its stem (kernels_avx2.cc, kernels_avx512.cc); it
# alone gets these flags, and the kernel table (csrc/common/isa.h) calls it only where the CPU
# has them. x86-64 only: elsewhere those files are not compiled and the portable kernels run.
ISA = {
    "avx2": ["-mavx2", "-mbmi2"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mbmi2"],
}
# The baseline of every other core file on x86-64: builds that say -march=native (BytePS's)
# must not let AVX into the portable kernels, which run on any x86-64.
BASELINE = ["-march=x86-64"]

# The CUDA twins (nvcc): --fmad=false is -ffp-contract=off for device code (the kernels also use
# __fmul_rn/__fadd_rn); host code gets CODEC's rules through -Xcompiler.
NVCC = ["-O3", "--fmad=false"] + STD


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def isa_of(path) -> str:
    """The instruction set a source file is written for ("avx2", "avx512"), or ""."""
    stem = os.path.splitext(os.path.basename(str(path)))[0]
    isa = stem.rsplit("_", 1)[-1]
    return isa if isa in ISA and "_" in stem else ""


def compiled_here(path) -> bool:
    """False for the files of an instruction set this machine's compiler does not target."""
    return not isa_of(path) or is_x86()


def core_flags(path) -> list:
    """The flags of one codec core file (csrc/thc, csrc/lhc): CODEC, the x86-64 baseline, and its
    instruction set's flags (which come after the baseline and widen it)."""
    return CODEC + (BASELINE if is_x86() else []) + ISA.get(isa_of(path), [])


def core_sources(csrc, cores=CORES) -> list:
    """The .cc files of the given cores under `csrc` (the csrc/ folder, or the BytePS tree's root,
    which holds thc/ and lhc/ the same way), sorted, those this machine cannot build left out."""
    out = []
    for core in cores:
        folder = os.path.join(str(csrc), core)
        out += [os.path.join(folder, f) for f in sorted(os.listdir(folder))
                if f.endswith(".cc") and compiled_here(f)]
    return out


def xcompiler(flags) -> list:
    """Host-compiler flags as nvcc takes them."""
    out = []
    for f in flags:
        out += ["-Xcompiler", f]
    return out
