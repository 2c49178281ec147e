"""LHC's settings, launcher flags and adapters without a cluster (the fork's pipeline:
tests/cluster/test_lhc_server.py and test_lhc_train.py)."""
import dataclasses

import pytest
import torch

from byteps_thc import LhcConfig, env, launch
from byteps_thc import compression as bc
from byteps_thc import mxnet as bm
from byteps_thc.torch import Compression


def test_lhc_settings_cover_every_config_field():
    assert set(env.LHC) == {f.name for f in dataclasses.fields(LhcConfig)}
    assert "lhc" in env.COMPRESSORS


def test_lhc_config_reads_and_writes_exactly_these_names():
    cfg = LhcConfig(capacity=5000, topk=0.01, seed=9, error_feedback=False,
                    topk_method="sampled")
    written = cfg.to_env()
    assert set(written) == {"BYTEPS_COMPRESSOR", "BYTEPS_LHC_CAPACITY", "BYTEPS_LHC_TOPK",
                            "BYTEPS_LHC_TOPK_METHOD", "BYTEPS_LHC_SEED",
                            "BYTEPS_LHC_ERROR_FEEDBACK"}
    assert written["BYTEPS_COMPRESSOR"] == "lhc"
    assert LhcConfig.from_env(written) == cfg
    assert LhcConfig().to_env()["BYTEPS_LHC_TOPK"] == "0"  # 0 reads back as None
    assert LhcConfig.from_env(LhcConfig().to_env()) == LhcConfig()
    with pytest.raises(ValueError, match="BYTEPS_LHC_CAPACITY='-3'"):
        LhcConfig.from_env({"BYTEPS_LHC_CAPACITY": "-3"})
    with pytest.raises(ValueError, match="topk=2.0"):
        LhcConfig.from_env({"BYTEPS_LHC_TOPK": "2"})


def test_lhc_flags_reach_the_environment():
    ns = launch.parse_args(["--local", "2", "--compressor", "lhc", "--lhc-capacity", "8192",
                            "--lhc-topk", "0.01", "--lhc-seed", "5", "--", "python", "t.py"])
    out = launch.compression_env(ns, {})
    assert out["BYTEPS_COMPRESSOR"] == "lhc" and out["BYTEPS_COMPRESSOR_SET_BY"] == "bpslaunch"
    assert out["BYTEPS_LHC_CAPACITY"] == "8192" and out["BYTEPS_LHC_TOPK"] == "0.01"
    assert bc.compressor_from_env(out) == ("lhc", LhcConfig(capacity=8192, topk=0.01, seed=5))
    # an LHC flag alone chooses LHC; with another compressor it is an error
    ns = launch.parse_args(["--lhc-capacity", "100", "--", "true"])
    assert ns.compressor == "lhc"
    with pytest.raises(SystemExit):
        launch.parse_args(["--compressor", "thc", "--lhc-topk", "0.1", "--", "true"])
    with pytest.raises(SystemExit):
        launch.parse_args(["--compressor", "lhc", "--lhc-topk", "1.5", "--", "true"])


def test_compression_lhc_declares_lhc_kwargs_for_large_float_tensors():
    c = Compression.lhc(capacity=4096, topk=0.05)
    assert c.config == LhcConfig(capacity=4096, topk=0.05)
    big = torch.zeros(1 << 15)
    assert c.kwargs(big, {}) == c.config.to_kwargs()
    assert c.kwargs(big, {"BYTEPS_THC_NONFINITE": "error"})["lhc_nonfinite"] == "error"
    assert c.kwargs(torch.zeros(100), {}) is None  # under BYTEPS_MIN_COMPRESS_BYTES
    assert c.kwargs(torch.zeros(1 << 20, dtype=torch.int64), {}) is None
    assert Compression.from_env(c.config.to_env()) == c
    assert "capacity=4096" in repr(c)
    with pytest.raises(ValueError, match="capacity=0"):
        Compression.lhc(capacity=0)
    with pytest.raises(TypeError, match="unknown LHC parameters"):
        Compression.lhc(bits=4)


def test_mxnet_takes_lhc_through_the_same_door():
    c = bm.from_params({"compressor": "lhc", "capacity": 1000})
    assert c.kwargs() == LhcConfig(capacity=1000).to_kwargs()
    assert bm.from_env(LhcConfig(capacity=7).to_env()).config == LhcConfig(capacity=7)
    with pytest.raises(ValueError, match="unknown keys"):
        bm.from_params({"compressor": "lhc", "bits": 4})
