"""The homomorphic codecs, each described once: `CODECS` maps a compressor name to its `Codec`.

Everything that offers a codec loops over this table: `Compression.<name>(...)` and
`Compression.from_env()` of every adapter (byteps_thc.compression), the MXNet adapter's
`compression_params` and launcher choice (byteps_thc.mxnet), and bpslaunch's `--<name>-*` flags,
their help and the environment they set (byteps_thc.launch.cli). A new homomorphic codec is its
package (config class with to_kwargs / from_env / to_env / describe), its Settings in
byteps_thc.env and its name in env.COMPRESSORS, and one entry here.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Mapping, Optional, Tuple

from . import env
from .lhc import LhcConfig
from .thc import ThcConfig


@dataclasses.dataclass(frozen=True)
class Flag:
    """One bpslaunch flag, `--<codec>-<field with dashes>`, setting the codec's Setting of
    `field`; the field "no_error_feedback" is a switch that sets error_feedback to 0.

    type: argparse's (int, float, or a parser of byteps_thc.env, whose ValueError becomes the
    flag's error); choices: the words it takes; help: its line, where "{default}" stands for the
    config class's default of the field."""
    field: str
    help: str
    metavar: Optional[str] = None
    type: Optional[Callable[[str], object]] = None
    choices: Optional[Tuple[str, ...]] = None

    @property
    def switch(self) -> bool:
        return self.field == "no_error_feedback"


@dataclasses.dataclass(frozen=True)
class Codec:
    """A homomorphic codec as the adapters and the launcher see it.

    name:             its compressor name: BYTEPS_COMPRESSOR, `bpslaunch --compressor`,
                      `Compression.<name>`, the kwargs' compressor_type
    config_class:     its configuration dataclass; its fields are the codec's parameters
    settings:         field -> the Setting of byteps_thc.env that carries it to the workers
    declare_settings: kwargs key -> a Setting of this worker that is declared with each tensor
                      when it differs from its default (absent: the fork's default)
    flags:            bpslaunch's flags, in the order of its help
    summary:          what it does, in one line (help and docstrings)
    check_workers:    (config, num_workers) -> None, raising ValueError when the configuration
                      cannot serve that many workers (bpslaunch --local N checks it)
    collective_only:  fields of the config class that only byteps_thc.collective (the DDP hook,
                      FSDP) honours: BytePS's compressor refuses them, so they are no BytePS
                      parameter, Setting or flag (the config class's defaults stand)
    """
    name: str
    config_class: type
    settings: Mapping[str, env.Setting]
    declare_settings: Mapping[str, env.Setting]
    flags: Tuple[Flag, ...]
    summary: str
    check_workers: Optional[Callable[[object, int], None]] = None
    collective_only: Tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.name.upper()

    @property
    def params(self) -> Tuple[str, ...]:
        """The codec's BytePS parameters: its config class's fields, in order, but the
        collective's own."""
        return tuple(f.name for f in dataclasses.fields(self.config_class)
                     if f.name not in self.collective_only)

    def config(self, config=None, **params):
        """`config`, or a configuration of `params` (the config class's fields; its defaults for
        the others), validated here, before any push."""
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise TypeError(f"unknown {self.label} parameters {unknown}; known: "
                            f"{list(self.params)}")
        if config is not None:
            if not isinstance(config, self.config_class):
                raise TypeError(f"config must be {self.config_class.__name__}, not "
                                f"{type(config).__name__}")
            if params:
                raise TypeError(f"give either config or {self.label} parameters, not both "
                                f"({sorted(params)})")
            return config
        return self.config_class(**params)

    def from_params(self, params: Mapping):
        """The configuration of upstream-style `compression_params` ({"compressor": name,
        field: value, ...}, as MXNet's trainer takes them); ValueError names unknown keys."""
        unknown = set(params) - {"compressor", *self.params}
        if unknown:
            raise ValueError(f"compression_params for {self.name}: unknown keys "
                             f"{sorted(unknown)}; known: {list(self.params)}")
        return self.config(**{k: v for k, v in params.items() if k != "compressor"})

    def from_env(self, environ: Optional[Mapping[str, str]] = None):
        """The configuration bpslaunch's flags set (the codec's Settings; defaults for the rest)."""
        return self.config_class.from_env(environ)

    def kwargs(self, config, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The BytePS compressor kwargs a tensor is declared with: `config.to_kwargs()` and each
        declare setting that differs from its default (the fork checks the values' ranges)."""
        kw = config.to_kwargs()
        for key, setting in self.declare_settings.items():
            value = setting.get(environ)
            if value != setting.default:
                kw[key] = str(value)
        return kw

    def repr(self, config) -> str:
        """`Compression.<name>(field=value, ...)`: the call that builds this compressor."""
        fields = ", ".join(f"{f}={getattr(config, f)!r}" for f in self.params)
        return f"Compression.{self.name}({fields})"


THC = Codec(
    name="thc",
    config_class=ThcConfig,
    settings=env.THC,
    # the server refuses a key whose workers disagree on the non-finite mode, as on the
    # configuration; the codec threads are this worker's own, and the server ignores them
    declare_settings={"thc_nonfinite": env.THC_NONFINITE,
                      "thc_codec_threads": env.THC_CODEC_THREADS},
    flags=(
        Flag("bits", "bits per coordinate going up (1..8, {default})", "B", int),
        Flag("granularity", "table values in [0, G], G >= 2^B - 1 ({default})", "G", int),
        Flag("overflow_prob", "clipped probability mass, e.g. 1/32 ({default:g})", "P",
             env.parse_probability),
        Flag("seed", "rotation seed, the same on every worker ({default})", "S", int),
        Flag("rotation_block", "Hadamard block, a power of two (0: tiled per partition)", "N",
             int),
        Flag("no_error_feedback", "turn THC's error feedback off"),
    ),
    summary="THC: table indices up, integer sums down (docs/ALGORITHM.md)",
    check_workers=ThcConfig.lane_bits,  # the server's sums of n workers must fit a lane
    collective_only=("block_scale",),  # one norm per partition in BytePS (ThcConfig.to_kwargs)
)

LHC = Codec(
    name="lhc",
    config_class=LhcConfig,
    settings=env.LHC,
    # LHC's max round is THC's, and so is its non-finite rule
    declare_settings={"lhc_nonfinite": env.THC_NONFINITE},
    flags=(
        Flag("capacity", "most nonzeros of one partition's summed gradient ({default})", "N",
             env.parse_positive_int),
        Flag("topk", "fraction each worker keeps (0: none dropped, the input as it is)", "F",
             float),
        Flag("topk_method", "exact top-k or a sampled threshold ({default})", "M",
             choices=("exact", "sampled")),
        Flag("seed", "hash seed, the same on every worker ({default})", "S", int),
        Flag("no_error_feedback", "turn LHC's top-k error feedback off"),
    ),
    summary="LHC: support bitmap and int32 sketch up, their OR and sum down, the exact sum "
            "decoded by peeling (docs/LHC.md)",
)

CODECS: Dict[str, Codec] = {c.name: c for c in (THC, LHC)}


def get(name: str) -> Codec:
    """The codec called `name`; ValueError naming the known ones otherwise."""
    codec = CODECS.get(name)
    if codec is None:
        raise ValueError(f"{name!r} is not a homomorphic codec; known: {', '.join(CODECS)}")
    return codec


def of_config(config) -> Optional[Codec]:
    """The codec whose configuration `config` is, or None."""
    for codec in CODECS.values():
        if isinstance(config, codec.config_class):
            return codec
    return None
