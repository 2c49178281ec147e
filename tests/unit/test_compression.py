"""byteps_thc.compression: the framework-free part every adapter (torch, TensorFlow, MXNet) uses."""
import pytest

from byteps_thc import compression as c
from byteps_thc import env
from byteps_thc.config import ThcConfig


def test_from_env_reads_what_bpslaunch_sets():
    assert c.compressor_from_env({}) == ("none", None)
    assert c.compressor_from_env({"BYTEPS_COMPRESSOR": " FP16 "}) == ("fp16", None)
    name, cfg = c.compressor_from_env({"BYTEPS_COMPRESSOR": "thc", "BYTEPS_THC_BITS": "3",
                                       "BYTEPS_THC_GRANULARITY": "14"})
    assert name == "thc" and cfg == ThcConfig(bits=3, granularity=14)
    assert c.compressor_from_env({"BYTEPS_COMPRESSOR": "onebit", "BYTEPS_COMPRESSOR_EF": "vanilla"}) \
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


def test_compression_base_with_a_toy_adapter():
    class Registry(c.RegistryCompressor):   # "tensors" are (is_float, nbytes) pairs
        def is_floating(self, t):
            return t[0]

        def wire_bytes(self, t):
            return t[1]

    class Thc(c.ThcMixin, Registry):
        pass

    class Compression(c.CompressionBase):
        none, fp16 = c.Compressor(), c.Compressor()
        _registry_class, _thc_class = Registry, Thc

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
    assert type(d) is Registry and d.kwargs((True, 1 << 20))["compressor_type"] == "dithering"


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
