"""byteps_thc.compression: the framework-free part every adapter (torch, TensorFlow, MXNet) uses."""
import pytest

from byteps_thc import compression as c
from byteps_thc import env
from byteps_thc.thc.config import ThcConfig


def test_from_env_reads_what_bpslaunch_sets():
    assert c.compressor_from_env({}) == ("none", None)
    assert c.compressor_from_env({"BYTEPS_COMPRESSOR": " FP16 "}) == ("fp16", None)
    name, cfg = c.compressor_from_env({"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3",
                                       "BYTEPS_THC_GRANULARITY": "14"})
    assert name == "thc" and cfg == ThcConfig(bits=3, granularity=14)
    assert c.compressor_from_env({"BYTEPS_COMPRESSOR": "onebit",
                                  "BYTEPS_COMPRESSOR_EF": "vanilla"}) \
        == ("onebit", {"compressor_type": "onebit", "compressor_onebit_scaling": "false",
                       "ef_type": "vanilla"})
    assert c.compressor_from_env({"BYTEPS_COMPRESSOR": "topk", "BYTEPS_COMPRESSOR_K": "0.01"}) \
        == ("topk", {"compressor_type": "topk", "compressor_k": "0.01"})
    with pytest.raises(ValueError, match="BYTEPS_COMPRESSOR_K"):
        c.compressor_from_env({"BYTEPS_COMPRESSOR": "randomk"})
    with pytest.raises(ValueError, match="'zip'"):
        c.compressor_from_env({"BYTEPS_COMPRESSOR": "zip"})
    with pytest.raises(ValueError, match="BYTEPS_COMPRESSOR_EF='classic'"):
        c.compressor_from_env({"BYTEPS_COMPRESSOR": "onebit", "BYTEPS_COMPRESSOR_EF": "classic"})


def test_registry_kwargs():
    assert c.k_kwargs("randomk", 4, seed=7, error_feedback=True) == {
        "compressor_type": "randomk", "compressor_k": "4", "seed": "7", "ef_type": "vanilla"}
    with pytest.raises(ValueError):
        c.k_kwargs("thc", 4)
    assert c.thc_config(bits=2, granularity=3) == ThcConfig(bits=2, granularity=3)
    cfg = ThcConfig(seed=5)
    assert c.thc_config(config=cfg) is cfg
    with pytest.raises(TypeError):
        c.thc_config(config={"bits": 4})
    assert env.MIN_COMPRESS_BYTES.get({}) == 65536
    assert env.MIN_COMPRESS_BYTES.get({"BYTEPS_MIN_COMPRESS_BYTES": "0"}) == 0
    # THC's parameters are ThcConfig's fields, its defaults the dataclass's; config or fields
    assert c.thc_config() == ThcConfig()
    with pytest.raises(TypeError, match="bitz"):
        c.thc_config(bitz=4)
    with pytest.raises(TypeError, match="not both"):
        c.thc_config(config=cfg, bits=3)


# A toy adapter: its "tensors" are (is_float, nbytes) pairs.
class _Registry(c.RegistryCompressor):
    def is_floating(self, t):
        return t[0]

    def wire_bytes(self, t):
        return t[1]


class _Thc(c.ThcMixin, _Registry):
    pass


class _None(c.Compressor):
    name = "none"


class _Fp16(c.Compressor):
    name = "fp16"


class _Compression(c.CompressionBase):
    none, fp16 = _None(), _Fp16()
    _registry_class, _thc_class = _Registry, _Thc


def test_compression_base_with_a_toy_adapter():
    Compression = _Compression
    thc = Compression.thc(bits=3, granularity=14)
    assert thc == Compression.from_env({"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3",
                                        "BYTEPS_THC_GRANULARITY": "14"})
    assert repr(thc).startswith("Compression.thc(bits=3, granularity=14,")
    assert thc.kwargs((True, 1 << 20)) == ThcConfig(bits=3, granularity=14).to_kwargs()
    assert thc.kwargs((True, 100)) is None and thc.kwargs((False, 1 << 20)) is None
    assert thc.kwargs((True, None)) is None
    assert thc.kwargs((True, 100), {"BYTEPS_MIN_COMPRESS_BYTES": "64"}) is not None
    with pytest.raises(ValueError, match="BYTEPS_MIN_COMPRESS_BYTES='-1'"):
        thc.kwargs((True, 100), {"BYTEPS_MIN_COMPRESS_BYTES": "-1"})
    assert repr(Compression.thc()) == ("Compression.thc(bits=4, granularity=30, "
                                       "overflow_prob=0.03125, seed=42, rotation_block=None, "
                                       "error_feedback=True)")
    assert Compression.from_env({}) is Compression.none
    d = Compression.dithering(2, seed=1)
    assert type(d) is _Registry and d.kwargs((True, 1 << 20))["compressor_type"] == "dithering"


def test_learning_rate_file_for_vanilla_error_feedback(tmp_path, monkeypatch):
    """./lr.s holds the rate BytePS's vanilla EF mmaps (8-byte native double); a zero rate keeps
    the last positive one (1.0 before any), never a ratio previous/current that is infinite."""
    import struct

    from byteps_thc.compression import LearningRateFile, uses_vanilla_ef
    monkeypatch.chdir(tmp_path)
    read = lambda: struct.unpack("d", (tmp_path / "lr.s").read_bytes())[0]  # noqa: E731
    f = LearningRateFile(0.0)
    assert read() == 1.0
    f.set(0.25)
    assert read() == 0.25
    f.set(0.0)
    f.set(float("nan"))
    assert read() == 0.25
    f.set(0.125)
    assert read() == 0.125 and (tmp_path / "lr.s").stat().st_size == 8
    assert uses_vanilla_ef({"compressor_type": "onebit", "ef_type": "vanilla"})
    assert not uses_vanilla_ef({"compressor_type": "onebit"}) and not uses_vanilla_ef(None)


# ------------------------------------------------------------------------------------------------
# Which compressor is in force (Compression.none is no choice) and saying so once
# ------------------------------------------------------------------------------------------------
THC_ENV = {"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3", "BYTEPS_THC_GRANULARITY": "14"}
LAUNCHED = {**THC_ENV, "BYTEPS_COMPRESSOR_SET_BY": "bpslaunch"}


def _choose(script, environ):
    return c.choose(script, lambda: _Compression.from_env(environ), environ)


@pytest.mark.parametrize("script", [None, _Compression.none])
def test_none_or_nothing_takes_the_launchers_choice(script):
    ch = _choose(script, LAUNCHED)
    assert ch.compressor == _Compression.thc(bits=3, granularity=14)
    assert ch.source == "bpslaunch --compressor thc" and ch.overridden is None
    ch = _choose(script, THC_ENV)  # set in the environment, not by bpslaunch
    assert ch.source == "the environment (BYTEPS_COMPRESSOR=thc)"
    assert c.conflict_message(ch, THC_ENV) is None


@pytest.mark.parametrize("environ", [{}, {"BYTEPS_COMPRESSOR": "none"}])
def test_without_a_launcher_choice_none_stays_none(environ):
    for script in (None, _Compression.none):
        ch = _choose(script, environ)
        assert ch.compressor is _Compression.none and ch.source == c.DEFAULT


def test_an_explicit_other_choice_stays_and_names_both():
    for script in (_Compression.fp16, _Compression.thc(bits=2), _Compression.topk(0.01)):
        ch = _choose(script, LAUNCHED)
        assert ch.compressor is script and ch.source == "script"
        msg = c.conflict_message(ch, LAUNCHED)
        assert f"the script chose {script!r}" in msg
        assert "bpslaunch --compressor thc chose Compression.thc(bits=3, granularity=14" in msg
        assert f"the script's {script!r} is in force" in msg
    # the same THC settings as the launcher's: nothing to warn about
    same = _Compression.thc(bits=3, granularity=14)
    assert c.conflict_message(_choose(same, LAUNCHED), LAUNCHED) is None
    assert _choose(_Compression.fp16, {}).overridden is None


def test_tally_counts_by_the_threshold():
    thc = _Compression.thc()
    tensors = [(True, 1 << 20), (True, 65536), (True, 65535), (True, 4), (False, 1 << 20),
               (True, None)]
    t = c.tally(thc, tensors)
    assert (t.tensors, t.compressed, t.small) == (6, 2, 2)
    t = c.tally(thc, tensors, {"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    assert (t.tensors, t.compressed, t.small) == (6, 4, 0)
    t = c.tally(_Compression.fp16, tensors)  # a cast of every tensor: nothing size-gated
    assert (t.tensors, t.compressed, t.small) == (6, 0, 0)


def test_in_force_line():
    ch = _choose(None, LAUNCHED)
    line = c.in_force_line(ch, c.Tally(6, 2, 3), LAUNCHED)
    assert line.startswith("byteps-thc: compressor " + ThcConfig(bits=3, granularity=14).describe())
    assert "; chosen by bpslaunch --compressor thc; 6 gradient tensors: 2 compressed, 3 under " \
           "BYTEPS_MIN_COMPRESS_BYTES=65536 go uncompressed, 1 not floating point" in line
    line = c.in_force_line(_choose(_Compression.fp16, {}), c.Tally(6, 0, 0), {})
    assert line == "byteps-thc: compressor Compression.fp16; chosen by script; 6 gradient tensors"


class _Stream(list):
    def write(self, text):
        self.append(text)

    def flush(self):
        pass


def test_report_says_each_thing_once_on_rank_0(recwarn):
    out = _Stream()
    report = c.RunReport(at_exit=False, stream=out)
    thc = _choose(None, LAUNCHED)
    report.announce(thc, c.Tally(3, 0, 3), rank=1)
    assert out == []                       # rank 1 says nothing
    report.announce(thc, c.Tally(3, 0, 3), rank=0)
    report.announce(thc, c.Tally(2, 0, 2), rank=0)
    assert len(out) == 1 and "3 gradient tensors: 0 compressed, 3 under" in out[0]
    assert report.nothing_compressed().startswith(
        "byteps-thc: THC was chosen but no tensor reached BYTEPS_MIN_COMPRESS_BYTES=65536")
    report.end_of_run()
    assert len(out) == 2 and out[1].startswith("byteps-thc: THC was chosen")
    report.announce(thc, c.Tally(1, 1, 0), rank=0)  # a later declare compressed one
    assert report.nothing_compressed() is None

    fp16 = _choose(_Compression.fp16, LAUNCHED)
    for rank in (1, 0, 0):
        report.warn_conflict(fp16, rank, LAUNCHED)
    assert [str(w.message) for w in recwarn] == [c.conflict_message(fp16, LAUNCHED)]


def test_no_end_of_run_message_unless_thc():
    report = c.RunReport(at_exit=False, stream=_Stream())
    report.announce(_choose(_Compression.fp16, {}), c.Tally(2, 0, 0), rank=0)
    report.announce(_choose(_Compression.topk(4), {}), c.Tally(2, 0, 2), rank=0)
    assert report.nothing_compressed() is None


def test_mxnet_trainer_choice():
    """byteps_thc.mxnet.choose: the trainer's choice, through the same compression.choose()."""
    from byteps_thc import mxnet as bmx
    ch = bmx.choose(None, None, LAUNCHED)
    assert isinstance(ch.compressor, bmx.ThcCompression) and ch.compressor.kwargs() == \
        ThcConfig(bits=3, granularity=14).to_kwargs()
    assert ch.source == "bpslaunch --compressor thc"
    # upstream's compression_params stay, with the launcher's THC named in the warning
    ch = bmx.choose(None, {"compressor": "onebit", "ef": "vanilla"}, LAUNCHED)
    assert ch.compressor.params == {"compressor": "onebit", "ef": "vanilla"}
    assert "the script chose compression_params={'compressor': 'onebit', 'ef': 'vanilla'}" in \
        c.conflict_message(ch, LAUNCHED)
    ch = bmx.choose(None, {"compressor": "thc", "bits": 2}, LAUNCHED)
    assert ch.compressor.config == ThcConfig(bits=2) and ch.source == "script"
    assert ch.overridden is not None
    # nothing chosen anywhere: upstream's own path, no compression
    ch = bmx.choose(None, None, {})
    assert repr(ch.compressor) == "Compression.none" and ch.compressor.params == {}
    assert c.in_force_line(ch, c.Tally(4, 0, 0), {}).endswith("; 4 gradient tensors")


def test_thc_kwargs_carry_the_nonfinite_mode():
    cfg = ThcConfig(bits=3, granularity=14)
    assert c.thc_kwargs(cfg, {}) == cfg.to_kwargs()  # propagate: the C++ default when absent
    assert c.thc_kwargs(cfg, {"BYTEPS_THC_NONFINITE": "propagate"}) == cfg.to_kwargs()
    assert c.thc_kwargs(cfg, {"BYTEPS_THC_NONFINITE": " Error "}) == \
        dict(cfg.to_kwargs(), thc_nonfinite="error")
    with pytest.raises(ValueError, match="BYTEPS_THC_NONFINITE='skip'"):
        c.thc_kwargs(cfg, {"BYTEPS_THC_NONFINITE": "skip"})
    thc = _Thc(cfg)
    assert thc.kwargs((True, 1 << 20), {"BYTEPS_THC_NONFINITE": "error"})["thc_nonfinite"] == \
        "error"
    assert thc.kwargs((True, 100), {"BYTEPS_THC_NONFINITE": "error"}) is None


def test_thc_kwargs_carry_the_codec_threads():
    """BYTEPS_THC_CODEC_THREADS: absent from the kwargs at its default of 1 (the fork's default
    when absent), else thc_codec_threads; not a positive integer is refused by name."""
    cfg = ThcConfig()
    assert c.thc_kwargs(cfg, {"BYTEPS_THC_CODEC_THREADS": "1"}) == cfg.to_kwargs()
    assert c.thc_kwargs(cfg, {"BYTEPS_THC_CODEC_THREADS": "4"}) == \
        dict(cfg.to_kwargs(), thc_codec_threads="4")
    for bad in ("0", "-2", "two"):
        with pytest.raises(ValueError, match=f"BYTEPS_THC_CODEC_THREADS='{bad}'"):
            c.thc_kwargs(cfg, {"BYTEPS_THC_CODEC_THREADS": bad})
