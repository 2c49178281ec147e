"""byteps_thc.env: one parser per variable; bad values are named."""
import pytest

from byteps_thc import env


def test_unset_and_empty_give_the_default():
    assert env.MIN_COMPRESS_BYTES.get({}) == 65536
    assert env.MIN_COMPRESS_BYTES.get({"BYTEPS_MIN_COMPRESS_BYTES": "  "}) == 65536
    assert env.MIN_COMPRESS_BYTES.get({"BYTEPS_MIN_COMPRESS_BYTES": "1024"}) == 1024


@pytest.mark.parametrize("text,value", [("1/32", 0.03125), ("0.25", 0.25), (" 1/4 ", 0.25)])
def test_probability(text, value):
    assert env.THC_OVERFLOW_PROB.get({"BYTEPS_THC_OVERFLOW_PROB": text}) == value


@pytest.mark.parametrize("text", ["0", "1", "1/0", "x", "-0.5"])
def test_bad_probability_names_variable_and_value(text):
    with pytest.raises(ValueError, match=r"BYTEPS_THC_OVERFLOW_PROB=.*not valid"):
        env.THC_OVERFLOW_PROB.get({"BYTEPS_THC_OVERFLOW_PROB": text})


def test_bool_and_optional_int():
    assert env.THC_ERROR_FEEDBACK.get({"BYTEPS_THC_ERROR_FEEDBACK": "off"}) is False
    assert env.THC_ROTATION_BLOCK.get({"BYTEPS_THC_ROTATION_BLOCK": "0"}) is None
    assert env.THC_ROTATION_BLOCK.get({"BYTEPS_THC_ROTATION_BLOCK": "1024"}) == 1024
    with pytest.raises(ValueError, match="BYTEPS_THC_ERROR_FEEDBACK='maybe'"):
        env.THC_ERROR_FEEDBACK.get({"BYTEPS_THC_ERROR_FEEDBACK": "maybe"})


@pytest.mark.parametrize("cpus,workers,size", [(2, 2, 1), (2, 1, 2), (16, 2, 4), (1, 4, 1)])
def test_threadpool_size(cpus, workers, size):
    assert env.threadpool_size(workers, cpus=cpus) == size


def test_thc_settings_cover_every_config_field():
    import dataclasses

    from byteps_thc import ThcConfig, codecs
    # the collective's own fields (block_scale) are refused by BytePS: no variable carries them
    assert set(env.THC) == ({f.name for f in dataclasses.fields(ThcConfig)}
                            - set(codecs.THC.collective_only))


def test_compressor_names_are_checked_where_they_are_read():
    assert env.COMPRESSOR.get({}) == "none"
    assert env.COMPRESSOR.get({"BYTEPS_COMPRESSOR": " THC "}) == "thc"
    with pytest.raises(ValueError, match=r"BYTEPS_COMPRESSOR='zip' is not valid: .*dithering"):
        env.COMPRESSOR.get({"BYTEPS_COMPRESSOR": "zip"})
    assert env.COMPRESSOR_EF.get({"BYTEPS_COMPRESSOR_EF": "Vanilla"}) == "vanilla"
    with pytest.raises(ValueError, match="BYTEPS_COMPRESSOR_EF='yes'"):
        env.COMPRESSOR_EF.get({"BYTEPS_COMPRESSOR_EF": "yes"})
    assert env.COMPRESSOR_K.get({}) is None
    assert env.COMPRESSOR_K.get({"BYTEPS_COMPRESSOR_K": " 0.01 "}) == "0.01"


def test_thc_config_reads_and_writes_exactly_these_names():
    from byteps_thc import ThcConfig
    written = ThcConfig(rotation_block=1024, error_feedback=False).to_env()
    assert set(written) == {"BYTEPS_COMPRESSOR", "BYTEPS_THC_BITS", "BYTEPS_THC_GRANULARITY",
                            "BYTEPS_THC_OVERFLOW_PROB", "BYTEPS_THC_SEED",
                            "BYTEPS_THC_ROTATION_BLOCK", "BYTEPS_THC_ERROR_FEEDBACK"}
    assert written["BYTEPS_COMPRESSOR"] == "thc"
    assert written["BYTEPS_THC_ERROR_FEEDBACK"] == "0"
    assert written["BYTEPS_THC_ROTATION_BLOCK"] == "1024"
    assert written["BYTEPS_THC_OVERFLOW_PROB"] == "0.03125"
    assert ThcConfig().to_env()["BYTEPS_THC_ROTATION_BLOCK"] == "0"   # 0 reads back as None
    # every value written parses with its variable's own Setting
    assert {f: s.get(written) for f, s in env.THC.items()} == {
        "bits": 4, "granularity": 30, "overflow_prob": 1 / 32, "seed": 42,
        "rotation_block": 1024, "error_feedback": False}
    # unset variables leave ThcConfig's defaults; a bad one is named with its value
    assert ThcConfig.from_env({"BYTEPS_THC_SEED": "7"}) == ThcConfig(seed=7)
    with pytest.raises(ValueError, match="BYTEPS_THC_OVERFLOW_PROB='2'"):
        ThcConfig.from_env({"BYTEPS_THC_OVERFLOW_PROB": "2"})
