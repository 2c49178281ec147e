"""byteps_thc.codecs: the one table of homomorphic codecs that the adapters and bpslaunch loop over.

Each check runs for every registered codec; SAMPLES holds one configuration per codec with every
field off its default, so that a codec added to the table without one fails here."""
import dataclasses

import pytest
import torch

from byteps_thc import LhcConfig, ThcConfig, codecs, env, launch
from byteps_thc import compression as bc
from byteps_thc import mxnet as bm
from byteps_thc.torch import Compression

SAMPLES = {
    "thc": ThcConfig(bits=3, granularity=14, overflow_prob=1 / 64, seed=7, rotation_block=1024,
                     error_feedback=False),
    "lhc": LhcConfig(capacity=5000, topk=0.01, seed=9, error_feedback=False,
                     topk_method="sampled"),
}
NAMES = sorted(codecs.CODECS)


def test_every_codec_has_a_sample_off_every_default():
    assert set(SAMPLES) == set(codecs.CODECS)
    for name, cfg in SAMPLES.items():
        default = type(cfg)()
        assert all(getattr(cfg, f) != getattr(default, f) for f in codecs.get(name).params)


@pytest.mark.parametrize("name", NAMES)
def test_entry_matches_its_config_class_and_settings(name):
    codec = codecs.get(name)
    assert codec.name == name and name in env.COMPRESSORS
    assert isinstance(SAMPLES[name], codec.config_class)
    fields = [f.name for f in dataclasses.fields(codec.config_class)
              if f.name not in codec.collective_only]
    assert list(codec.params) == fields
    assert set(codec.settings) == set(fields)  # one Setting per parameter, no other
    assert all(isinstance(s, env.Setting) for s in codec.settings.values())
    assert codecs.of_config(SAMPLES[name]) is codec


@pytest.mark.parametrize("name", NAMES)
def test_kwargs_round_trip_through_the_config(name):
    codec, cfg = codecs.get(name), SAMPLES[name]
    kw = codec.kwargs(cfg, {})
    assert kw["compressor_type"] == name and all(isinstance(v, str) for v in kw.values())
    assert kw == cfg.to_kwargs()  # nothing added while every declare setting is at its default
    assert codec.config_class.from_kwargs(kw) == cfg
    assert codec.from_env(cfg.to_env()) == cfg
    assert cfg.to_env()[env.COMPRESSOR.name] == name


@pytest.mark.parametrize("name", NAMES)
def test_declare_settings_join_the_kwargs_only_off_their_default(name):
    codec, cfg = codecs.get(name), SAMPLES[name]
    assert codec.declare_settings, "every codec declares at least its non-finite mode"
    assert f"{name}_nonfinite" in codec.declare_settings
    environ = {env.THC_NONFINITE.name: "error"}
    assert codec.kwargs(cfg, environ) == dict(cfg.to_kwargs(), **{f"{name}_nonfinite": "error"})
    with pytest.raises(ValueError, match="BYTEPS_THC_NONFINITE='skip'"):
        codec.kwargs(cfg, {env.THC_NONFINITE.name: "skip"})


@pytest.mark.parametrize("name", NAMES)
def test_config_helper_checks_parameters(name):
    codec, cfg = codecs.get(name), SAMPLES[name]
    assert codec.config(config=cfg) is cfg
    assert codec.config(**{f: getattr(cfg, f) for f in codec.params}) == cfg
    with pytest.raises(TypeError, match=f"unknown {name.upper()} parameters \\['nope'\\]"):
        codec.config(nope=1)
    with pytest.raises(TypeError, match="not both"):
        codec.config(config=cfg, seed=1)
    with pytest.raises(TypeError, match=codec.config_class.__name__):
        codec.config(config={"seed": 1})
    assert codec.from_params({"compressor": name, "seed": 3}) == codec.config_class(seed=3)
    with pytest.raises(ValueError, match=f"compression_params for {name}: unknown keys"):
        codec.from_params({"compressor": name, "nope": 1})


@pytest.mark.parametrize("name", NAMES)
def test_bpslaunch_has_every_flag_of_every_codec(name, capsys):
    codec, cfg = codecs.get(name), SAMPLES[name]
    argv = []
    for flag in codec.flags:
        if flag.switch:
            assert cfg.error_feedback is False
            argv.append(f"--{name}-no-error-feedback")
        else:
            value = getattr(cfg, flag.field)
            argv += [f"--{name}-{flag.field.replace('_', '-')}",
                     value if isinstance(value, str) else repr(value)]
    # every parameter has a flag (error_feedback through the switch)
    assert {f.field for f in codec.flags} == \
        {("no_error_feedback" if p == "error_feedback" else p) for p in codec.params}
    ns = launch.parse_args(argv + ["--", "true"])
    assert ns.compressor == name  # a codec's flag alone chooses it
    out = launch.compression_env(ns, {})
    assert codec.from_env(out) == cfg
    assert bc.compressor_from_env(out) == (name, cfg)
    with pytest.raises(SystemExit):
        launch.parse_args(["--compressor", "fp16"] + argv + ["--", "true"])
    assert f"needs --compressor {name}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in codec.flags:
        assert f"--{name}-{flag.field.replace('_', '-')}" in text
    for setting in codec.settings.values():
        assert setting.name in text


@pytest.mark.parametrize("name", NAMES)
def test_every_adapter_offers_every_codec(name):
    codec, cfg = codecs.get(name), SAMPLES[name]
    c = getattr(Compression, name)(config=cfg)
    assert isinstance(c, bc.codec_mixin(codec)) and c.config is cfg
    assert c == Compression.from_env(cfg.to_env())
    assert repr(c) == codec.repr(cfg) and repr(c).startswith(f"Compression.{name}(")
    assert c.kwargs(torch.zeros(1 << 15), {}) == cfg.to_kwargs()
    assert c.kwargs(torch.zeros(10), {}) is None  # under BYTEPS_MIN_COMPRESS_BYTES
    assert bc.describe(c) == cfg.describe()
    m = getattr(bm.Compression, name)(config=cfg)
    assert m.name == name and m.kwargs() == cfg.to_kwargs()
    assert bm.from_env(cfg.to_env()).config == cfg
    assert bm.from_params({"compressor": name, "seed": 3}).config == codec.config_class(seed=3)


def test_a_codec_needs_no_compressor_class_of_an_adapter():
    class Toy(Compression):  # torch's adapter, as if it named no compressor class of a codec
        _thc_class = _lhc_class = None

    for name in NAMES:
        cfg = SAMPLES[name]
        c = getattr(Toy, name)(config=cfg)
        assert isinstance(c, Toy._registry_class)
        assert isinstance(c, bc.codec_mixin(codecs.get(name)))
        assert type(c) is Toy.codec_class(name)  # one class per adapter and codec
        assert c.kwargs(torch.zeros(1 << 15), {}) == cfg.to_kwargs()
        assert c.kwargs(torch.zeros(1 << 15, dtype=torch.int32), {}) is None
        assert Toy.from_env(cfg.to_env()) == c


def test_an_unknown_codec_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="'zip' is not a homomorphic codec; known: thc, lhc"):
        codecs.get("zip")
    with pytest.raises(ValueError, match="known: thc, lhc"):
        Compression.codec_class("zip")
    assert codecs.of_config(object()) is None
    assert bm.from_params({"compressor": "zip"}) is None  # BytePS's own: upstream's to handle
