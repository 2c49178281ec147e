"""ThcConfig: validation, environment, kwargs round trip, for_workers."""
import pytest

from byteps_thc import ThcConfig, env


def test_defaults_are_the_papers():
    c = ThcConfig()
    assert ((c.bits, c.granularity, c.overflow_prob, c.seed, c.error_feedback)
            == (4, 30, 1 / 32, 42, True))
    assert c.clip == pytest.approx(2.15387, abs=1e-5)
    assert list(c.table) == [0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30]


@pytest.mark.parametrize("kw,msg", [
    (dict(bits=9), "bits=9"), (dict(granularity=10), "granularity=10"),
    (dict(overflow_prob=0), "overflow_prob=0"), (dict(seed=-1), "seed=-1"),
    (dict(rotation_block=1000), "rotation_block=1000"),
    (dict(error_feedback="yes"), "error_feedback"),
])
def test_validation_names_the_bad_value(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ThcConfig(**kw)


def test_lane_bits():
    c = ThcConfig()
    assert [c.lane_bits(n) for n in (1, 8, 9, 2184, 2185)] == [8, 8, 16, 16, 32]
    big = ThcConfig(bits=8, granularity=(1 << 24) - 1)
    with pytest.raises(ValueError, match="overflows a 32-bit sum"):
        big.lane_bits(300)


def test_env_round_trip():
    c = ThcConfig(bits=3, granularity=16, overflow_prob=1 / 64, seed=7, rotation_block=1024,
                  error_feedback=False)
    assert ThcConfig.from_env(c.to_env()) == c
    assert ThcConfig.from_env({}) == ThcConfig()
    assert ThcConfig.from_env({env.THC_OVERFLOW_PROB.name: "1/128"}).overflow_prob == 1 / 128


def test_env_errors_name_the_variable():
    with pytest.raises(ValueError, match="BYTEPS_THC_BITS='four'"):
        ThcConfig.from_env({"BYTEPS_THC_BITS": "four"})
    with pytest.raises(ValueError, match="bits=12"):
        ThcConfig.from_env({"BYTEPS_THC_BITS": "12"})


def test_kwargs_round_trip_and_fingerprint():
    c = ThcConfig(seed=5)
    kw = c.to_kwargs()
    assert kw["compressor_type"] == "thc" and kw["thc_table"].startswith("0,3,5")
    assert all(isinstance(v, str) for v in kw.values())
    assert ThcConfig.from_kwargs(kw) == c
    assert c.fingerprint() == ThcConfig(seed=5, error_feedback=False).fingerprint()
    assert c.fingerprint() != ThcConfig(seed=6).fingerprint()
    assert c.fingerprint() != ThcConfig(seed=5, granularity=31).fingerprint()


def test_for_workers_fits_the_lane_and_beats_the_default():
    for n in (1, 2, 4, 8):
        c = ThcConfig.for_workers(n)
        assert n * c.granularity <= 255
        assert c.expected_error()["total"] <= ThcConfig().expected_error()["total"]
    assert ThcConfig.for_workers(4).granularity == 63
    assert ThcConfig.for_workers(4).expected_error()["total"] == pytest.approx(0.0178, abs=3e-4)
    assert ThcConfig.for_workers(2, downstream_bits=16).lane_bits(2) == 16
    with pytest.raises(ValueError, match="downstream_bits=16"):
        ThcConfig.for_workers(20)
