"""A codec configuration and the environment: each field of the dataclass is one Setting of
byteps_thc.env (env.THC, env.LHC), which owns its variable's name and parser; the dataclass
owns the defaults (its Setting defaults to None, "the dataclass's default").
"""
from __future__ import annotations

from typing import Mapping, Optional

from .. import env


def config_from_env(cls, settings: Mapping[str, env.Setting],
                    environ: Optional[Mapping[str, str]] = None):
    """cls of the fields whose variables are set in `environ` (default os.environ); the
    dataclass's defaults for the rest. A value that does not parse raises with the variable
    named, one the dataclass refuses with the field named."""
    return cls(**{field: setting.get(environ) for field, setting in settings.items()
                  if setting.is_set(environ)})


def value_text(value) -> str:
    """A field's value as the text its Setting's parser reads back: a bool as 1/0, None as 0
    (the parsers read 0 back as None), a word as it is, a number as its repr (exact for a
    float)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "0"
    if isinstance(value, str):
        return value
    return repr(value)


def config_to_env(config, compressor: str, settings: Mapping[str, env.Setting]) -> dict:
    """The variables that choose `compressor` with `config`: BYTEPS_COMPRESSOR and every one of
    `settings` (launcher side; config_from_env reads them back to an equal config)."""
    out = {env.COMPRESSOR.name: compressor}
    for field, setting in settings.items():
        out[setting.name] = value_text(getattr(config, field))
    return out
