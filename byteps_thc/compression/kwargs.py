"""The kwargs each compressor is declared with in BytePS's C++ registry (the same strings on every
framework), and what bpslaunch chose, read back from the environment it sets."""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from .. import codecs, env

K_COMPRESSORS = ("topk", "randomk", "dithering")

# THC's and LHC's helpers under their own names (codecs.THC / codecs.LHC are the one definition)
thc_config = codecs.THC.config
thc_kwargs = codecs.THC.kwargs
lhc_config = codecs.LHC.config
lhc_kwargs = codecs.LHC.kwargs


def onebit_kwargs(scaling: bool = False, error_feedback: bool = False) -> Dict[str, str]:
    kw = {"compressor_type": "onebit", "compressor_onebit_scaling": str(bool(scaling)).lower()}
    if error_feedback:
        kw["ef_type"] = "vanilla"
    return kw


def k_kwargs(name: str, k, seed: Optional[int] = None,
             error_feedback: bool = False) -> Dict[str, str]:
    """kwargs of BytePS's topk, randomk and dithering (k: count, fraction or levels)."""
    if name not in K_COMPRESSORS:
        raise ValueError(f"{name!r} is not one of {', '.join(K_COMPRESSORS)}")
    kw = {"compressor_type": name, "compressor_k": str(k)}
    if seed is not None:
        kw["seed"] = str(seed)
    if error_feedback:
        kw["ef_type"] = "vanilla"
    return kw


def compressor_from_env(environ: Optional[Mapping[str, str]] = None) -> Tuple[str, object]:
    """What `bpslaunch --compressor` chose, as (name, what): ("none", None), ("fp16", None),
    (a codec's name, its configuration: ThcConfig, LhcConfig) or (registry name, kwargs)."""
    name = env.COMPRESSOR.get(environ)  # one of env.COMPRESSORS, else it raises
    ef = env.COMPRESSOR_EF.get(environ) == "vanilla"
    if name in ("none", "fp16"):
        return name, None
    if name in codecs.CODECS:
        return name, codecs.CODECS[name].from_env(environ)
    if name == "onebit":
        return name, onebit_kwargs(error_feedback=ef)
    k = env.COMPRESSOR_K.get(environ)  # name is one of K_COMPRESSORS
    if k is None:
        raise ValueError(f"{env.COMPRESSOR.name}={name} needs {env.COMPRESSOR_K.name}")
    return name, k_kwargs(name, k, error_feedback=ef)
