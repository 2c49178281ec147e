"""The time-to-accuracy task (benchmarks/stdlib_lm.py) and bench_tta.py's input checks, without a
cluster: the corpus rule, the data order, the model's start, the target rule."""
import math
import os

import pytest

from benchmarks import bench_tta, stdlib_lm


def _tree(tmp_path, names):
    for n in names:
        p = tmp_path / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x = %r\n" % n.encode())
    return str(tmp_path)


def test_corpus_files_are_sorted_sources_outside_site_packages(tmp_path):
    root = _tree(tmp_path, ["b.py", "a/z.py", "a/b.py", "notes.txt", "site-packages/pkg.py",
                            "dist-packages/x.py", "a/__pycache__/b.cpython-311.py"])
    assert stdlib_lm.corpus_files(root) == ["a/b.py", "a/z.py", "b.py"]


def test_empty_tree_is_refused_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        stdlib_lm.corpus_files(str(tmp_path))


def test_split_of_the_real_stdlib():
    files = stdlib_lm.corpus_files()
    held = [f for f in files if stdlib_lm.is_heldout(f)]
    # whole files, about one in twenty, the same answer for the same name
    assert 0.02 * len(files) < len(held) < 0.10 * len(files), (len(held), len(files))
    assert [f for f in files if stdlib_lm.is_heldout(f)] == held
    assert "os.py" in files and "site-packages" not in "".join(files)
    c = stdlib_lm.load_corpus()
    assert c.files_train + c.files_heldout == len(files)
    assert c.files_heldout == len(held)
    # every file ends with one NUL, which no source file holds
    assert c.train.count(b"\0") == c.files_train and c.heldout.count(b"\0") == c.files_heldout
    texts = []
    for rel in held:
        with open(os.path.join(stdlib_lm.stdlib_root(), rel), "rb") as f:
            texts.append(f.read())
    assert c.heldout.startswith(texts[0] + b"\0")
    assert max(texts, key=len) not in c.train


def test_a_split_with_an_empty_side_is_refused(tmp_path):
    # one file only: it lands on one side, the other stays empty
    root = _tree(tmp_path, ["only.py"])
    with pytest.raises(ValueError, match="empty side"):
        stdlib_lm.load_corpus(root)


def test_data_order_depends_on_seed_and_rank_only():
    import torch
    c = stdlib_lm.load_corpus()
    a, b = stdlib_lm.Batches(c, 32, 3, rank=1, seed=5), stdlib_lm.Batches(c, 32, 3, rank=1, seed=5)
    other = stdlib_lm.Batches(c, 32, 3, rank=0, seed=5)
    xa, ya = a.next()
    xb, yb = b.next()
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(other.next()[0], xa)
    assert xa.shape == (3, 32)
    assert torch.equal(xa[:, 1:], ya[:, :-1])       # y is x shifted by one byte
    assert torch.equal(a.eval_x, other.eval_x)      # one held-out set for every rank


def test_model_starts_alike_and_near_uniform():
    import torch
    cfg = stdlib_lm.LmConfig(dim=32, layers=1, heads=2, seq=16)
    m1, m2 = stdlib_lm.make_model(cfg, seed=3), stdlib_lm.make_model(cfg, seed=3)
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)
    data = stdlib_lm.Batches(stdlib_lm.load_corpus(), 16, 2, 0, eval_windows=4)
    # 256 byte values, small initial weights: close to the uniform loss ln 256
    assert abs(stdlib_lm.evaluate(m1, data) - math.log(256)) < 0.1
    # the default size is what the docs state
    d = stdlib_lm.LmConfig()
    per_layer = 4 * d.dim + (3 * d.dim ** 2 + 3 * d.dim) + (d.dim ** 2 + d.dim) + \
        (4 * d.dim ** 2 + 4 * d.dim) + (4 * d.dim ** 2 + d.dim)
    expected = d.layers * per_layer + 256 * d.dim * 2 + d.seq * d.dim + 2 * d.dim
    assert expected == 3323392
    assert stdlib_lm.param_count(stdlib_lm.make_model(d)) == expected


@pytest.mark.parametrize("bad", [dict(dim=0), dict(dim=30, heads=4), dict(seq=2.5)])
def test_bad_config_names_the_value(bad):
    with pytest.raises(ValueError, match="LmConfig"):
        stdlib_lm.LmConfig(**bad)


def test_time_to_target_is_the_first_evaluation_at_or_below():
    curve = [[0.0, 0, 5.5], [1.0, 10, 3.0], [2.0, 20, 2.5], [3.0, 30, 2.6]]
    assert stdlib_lm.time_to_target(curve, 2.55) == (2.0, 20)
    assert stdlib_lm.time_to_target(curve, 3.0) == (1.0, 10)
    assert stdlib_lm.time_to_target(curve, 2.0) == (None, None)
    assert stdlib_lm.time_to_target(curve, None) == (None, None)


def test_rows_put_fp32_first_and_refuse_unknown_names():
    rows = bench_tta.parse_rows("thc,fp16,none,ddp-thc,topk-0.01+ef", 2)
    assert [r[0] for r in rows][0] == "none"
    assert {r[0] for r in rows} == {"none", "fp16", "thc", "ddp-thc", "topk-0.01+ef"}
    assert dict(rows)["ddp-thc"] == "thc"
    rows = dict(bench_tta.parse_rows("fsdp-thc-ef-off,fsdp-bf16,fsdp", 2))
    assert list(rows)[0] == "fsdp"  # the fp32 row without a BytePS or DDP one: the target's
    assert (rows["fsdp-bf16"].reduce_dtype, rows["fsdp-bf16"].error_feedback) == ("bfloat16", None)
    assert (rows["fsdp-thc-ef-off"].reduce_dtype, rows["fsdp-thc-ef-off"].error_feedback) == \
        ("float32", "off")
    with pytest.raises(ValueError, match="'zstd'"):
        bench_tta.parse_rows("none,zstd", 2)
    with pytest.raises(ValueError, match="named twice: thc"):
        bench_tta.parse_rows("thc,thc", 2)


def test_main_refuses_an_unknown_compressor_before_building_anything(capsys):
    assert bench_tta.main(["--compressors", "none,thc,bogus"]) == 2
    assert "'bogus'" in capsys.readouterr().err


def test_targets_come_from_each_groups_fp32_run():
    def rec(comp, bw, final, curve):
        return {"compressor": comp, "workers": 2, "bandwidth_gbit": bw, "status": "ok",
                "final_val_loss": final, "curve": curve}
    recs = [rec("none", 1.0, 2.0, [[0, 0, 5.5], [9, 100, 2.0]]),
            rec("thc", 1.0, 2.01, [[0, 0, 5.5], [4, 50, 2.02], [8, 100, 2.01]]),
            rec("ddp", 10.0, 3.0, [[0, 0, 5.5], [5, 100, 3.0]]),
            rec("thc", 10.0, 3.5, [[0, 0, 5.5], [5, 100, 3.5]])]
    other = dict(rec("thc", 1.0, 2.01, [[0, 0, 5.5], [8, 100, 2.01]]), invocation="later")
    bench_tta.apply_targets(recs + [other], None)
    # another invocation's run (other load) takes no target from this one's fp32 run
    assert other["target_val_loss"] is None and other["time_to_target_s"] is None
    assert recs[1]["target_val_loss"] == pytest.approx(2.02)
    assert (recs[1]["time_to_target_s"], recs[1]["steps_to_target"]) == (4, 50)
    assert recs[3]["target_val_loss"] == pytest.approx(3.03) and recs[3]["target_from"] == "ddp"
    assert recs[3]["time_to_target_s"] is None
    bench_tta.apply_targets(recs, 2.5)
    assert recs[3]["target_val_loss"] == 2.5 and recs[1]["steps_to_target"] == 50
