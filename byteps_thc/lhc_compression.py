"""LHC's part of the framework-free compression API (byteps_thc.compression uses it).

`Compression.lhc(...)` on every framework declares a tensor with `lhc_kwargs(config)`, the
configuration's `LhcConfig.to_kwargs()` plus the non-finite mode that THC's max round shares
(BYTEPS_THC_NONFINITE). The fork's `lhc` compressor (csrc/byteps/src/.../lhc_compressor.cc)
parses exactly these keys and the server refuses a key whose workers disagree. Where peeling
leaves indices unresolved, the fork's exact fallback round completes the sum (docs/LHC.md), so
no push_pull returns a wrong or partial value. Nothing here imports a framework.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional

from . import env
from .lhc import LhcConfig

LHC_PARAMS = tuple(f.name for f in dataclasses.fields(LhcConfig))


def lhc_config(config: Optional[LhcConfig] = None, **params) -> LhcConfig:
    """`config`, or an LhcConfig of `params` (capacity, topk, seed, error_feedback, topk_method;
    LhcConfig's defaults for the others), validated here, before any push."""
    unknown = sorted(set(params) - set(LHC_PARAMS))
    if unknown:
        raise TypeError(f"unknown LHC parameters {unknown}; known: {list(LHC_PARAMS)}")
    if config is not None:
        if not isinstance(config, LhcConfig):
            raise TypeError(f"config must be an LhcConfig, not {type(config).__name__}")
        if params:
            raise TypeError(f"give either config or LHC parameters, not both ({sorted(params)})")
        return config
    return LhcConfig(**params)


def lhc_kwargs(config: LhcConfig, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The kwargs an LHC tensor is declared with; lhc_nonfinite=error when BYTEPS_THC_NONFINITE
    says so (the max round is THC's, and so is its non-finite rule)."""
    kw = config.to_kwargs()
    if env.THC_NONFINITE.get(environ) != env.THC_NONFINITE.default:
        kw["lhc_nonfinite"] = env.THC_NONFINITE.get(environ)
    return kw


def lhc_repr(config: LhcConfig) -> str:
    fields = ", ".join(f"{f}={getattr(config, f)!r}" for f in LHC_PARAMS)
    return f"Compression.lhc({fields})"


class LhcMixin:
    """LHC: support bitmap and int32 count sketch up, their OR and sum down, the exact sum
    decoded by peeling (docs/LHC.md). Put in front of an adapter's RegistryCompressor."""

    def __init__(self, config: LhcConfig):
        self.config = lhc_config(config=config)
        super().__init__("lhc", self.config.to_kwargs())

    def kwargs(self, tensor, environ: Optional[Mapping[str, str]] = None):
        kw = super().kwargs(tensor, environ)
        return None if kw is None else lhc_kwargs(self.config, environ)

    def __repr__(self):
        return lhc_repr(self.config)

    def __eq__(self, other):
        return isinstance(other, LhcMixin) and other.config == self.config

    def __hash__(self):
        return hash(self.config)
