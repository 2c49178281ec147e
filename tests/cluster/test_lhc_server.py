"""The server's LHC path: the real BytePS scheduler and server (the fork build) driven by real
ps-lite clients (harness/thc_client.cc) that send exactly what the fork's `lhc`
compressor sends, for 2 and 3 workers:

- the max round (THC's, one double per worker) returns max |v| over the workers;
- the pulled payload equals byteps_thc.LhcAggregator's bit for bit (OR of the bitmaps, int32
  sums of the sketches), over several rounds, and decodes to the exact mean of the quantised
  inputs, computed here in integers from the reference's quantiser;
- a wrong length, a wrong magic, a mismatched fingerprint (another seed), a worker payload whose
  count is not 1, a scale that the scale rule excludes (its int32 sums could overflow), a worker
  that could not encode, and mismatched or malformed registrations fail that round (or every
  round of the key) with a message naming the key, the sender and the bad value, while the
  server stays up and the next rounds work;
- the exact fallback round: an overloaded data round completes exactly from the workers'
  values at the unresolved indices, summed by the server; bad fallback pushes (count, length,
  fingerprint, a key that is not LHC's) fail their round with the key and the sender named;
- the stall inspector watches the fallback round as it does the others: a worker that never
  pushes its fallback values is named, and the round fails for the worker that waits;
- a seeded fuzz of headers and lengths (LHC_TEST_FUZZ_SEED, LHC_TEST_FUZZ_ROUNDS): every broken
  push fails its round with the error every worker pulls, and a clean round follows.
"""
from __future__ import annotations

import os
import re
import struct
import time

import numpy as np
import pytest

import test_thc_server as ts
from byteps_thc import LhcAggregator, LhcCodec, LhcConfig, LhcDecodeError, ThcConfig
from byteps_thc.lhc import reference as R
from harness import pslite as tc

pytestmark = pytest.mark.needs_fork("server")

HEADER = struct.Struct("<IHHiIQ")  # magic, version, reserved, scale_exp, count, fingerprint
SEED = int(os.environ.get("LHC_TEST_FUZZ_SEED", "20261202"))
FUZZ_ROUNDS = int(os.environ.get("LHC_TEST_FUZZ_ROUNDS", "40"))


@pytest.fixture(scope="module", params=[2, 3], ids=["2workers", "3workers"])
def cluster(request, client_exe, tmp_path_factory):
    c = tc.Cluster(request.param, tmp_path_factory.mktemp(f"lhc{request.param}"), client_exe,
                   tc.server_argv())
    c.node_ids = [int(c.clients[i].cmd("hello").split()[2]) for i in range(c.n)]
    yield c
    c.close()


class LhcKey(ts.Key):
    """One LHC partition key: init push, registration, max rounds and data rounds."""

    def __init__(self, cluster, key, d, cfg, kwargs=None):
        self.cfg = cfg
        super().__init__(cluster, key, d, cfg.to_kwargs() if kwargs is None else kwargs)
        self.codecs = [LhcCodec(cfg, d, rank=i, key=key) for i in range(cluster.n)]

    def max_round(self, values, fp=None):
        fp = self.codecs[0].fingerprint if fp is None else fp
        return self.round([struct.pack("<Qd", fp, v) for v in values], cmd_type=tc.THC_NORM,
                          dtype=tc.FLOAT64, capacity=2048)

    def data_round(self, payloads):
        return self.round(payloads, capacity=64 + self.codecs[0].payload_bytes + 2048)


def sparse_inputs(rng, n, d, nnz):
    xs = []
    for i in range(n):
        x = np.zeros(d, np.float32)
        idx = rng.choice(d, nnz, replace=False)
        x[idx] = (rng.standard_normal(nnz) * (i + 1)).astype(np.float32)
        xs.append(x)
    return xs


def agreed_round(k, xs):
    """The max round, then each worker's payload on its result (the compressor's order)."""
    n = k.c.n
    m = max(codec.max_abs(x) for codec, x in zip(k.codecs, xs))
    for r in k.max_round([codec.max_abs(x) for codec, x in zip(k.codecs, xs)]):
        h, body = tc.parse_reply(r)
        assert h["status"] == 0, body.decode(errors="replace")
        assert struct.unpack("<d", body)[0] == m and h["num_workers"] == n
    return m, [codec.encode(x, m, num_workers=n) for codec, x in zip(k.codecs, xs)]


def exact_mean(k, xs, m, steps):
    """The exact mean of the workers' inputs `xs` as the key's codecs quantise them at max |v|
    `m` and their `steps`: the reference's quantised values summed in integers (not the
    decoder's arithmetic)."""
    n, d = len(xs), k.d
    e = R.scale_exponent(m, n)
    total = np.zeros(d, np.int64)
    for i, x in enumerate(xs):
        _, _, idx, q = R.encode(k.cfg, x, m, n, k.codecs[0].m_buckets, rank=i, step=steps[i],
                                key=k.key, with_values=True)
        total[idx] += q
    return (total.astype(np.float64) * 2.0 ** -e / n).astype(np.float32)


def error_of(reply):
    h, body = tc.parse_reply(reply)
    assert h["status"] != 0, "expected the round to fail"
    return body.decode()


def payload_with(payload, **fields):
    """`payload` with header fields replaced (magic, version, reserved, e, count, fp)."""
    names = ("magic", "version", "reserved", "e", "count", "fp")
    values = dict(zip(names, HEADER.unpack_from(bytes(payload))))
    values.update(fields)
    return HEADER.pack(*(values[f] for f in names)) + bytes(payload)[HEADER.size:]


# ---- sums --------------------------------------------------------------------------------------
@pytest.mark.parametrize("d,capacity,nnz,keyno", [
    (50_000, 2_000, 500, 40),   # a sparse gradient well inside the capacity
    (3_000, 10_000, 900, 41),   # d < capacity: sized for d
])
def test_lhc_sums_bit_exact_and_decode_exact(cluster, d, capacity, nnz, keyno):
    n, key = cluster.n, keyno << 16
    cfg = LhcConfig(capacity=capacity, seed=7)
    k = LhcKey(cluster, key, d, cfg)
    rng = np.random.default_rng(keyno * 10 + n)
    for rnd in range(3):
        xs = sparse_inputs(rng, n, d, nnz)
        steps = [codec.step for codec in k.codecs]
        m, payloads = agreed_round(k, xs)
        agg = LhcAggregator(cfg, d, num_workers=n, key=key)
        for p in payloads:
            agg.add(p)
        want = agg.result()
        replies = k.data_round([p.tobytes() for p in payloads])
        for r in replies:
            h, body = tc.parse_reply(r)
            assert h["status"] == 0, body.decode(errors="replace")
            assert h["num_workers"] == n and h["round"] == rnd + 1
            assert np.array_equal(np.frombuffer(body, np.uint8), want)
        exact = exact_mean(k, xs, m, steps)
        got = k.codecs[0].decode(np.frombuffer(tc.parse_reply(replies[-1])[1], np.uint8), m, n)
        assert np.array_equal(got, exact)
    assert cluster.server_alive()


# ---- refusals ----------------------------------------------------------------------------------
def test_bad_payloads_fail_round_naming_key_sender_and_value(cluster):
    n, key = cluster.n, 42 << 16
    d = 20_000
    cfg = LhcConfig(capacity=1_000, seed=3)
    k = LhcKey(cluster, key, d, cfg)
    rng = np.random.default_rng(5 + n)
    node = cluster.node_ids[0]
    other_seed = LhcCodec(LhcConfig(capacity=1_000, seed=4), d, rank=0, key=key)

    def bad_round(make_bad, *expect):
        xs = sparse_inputs(rng, n, d, 200)
        m, payloads = agreed_round(k, xs)
        pushes = [p.tobytes() for p in payloads]
        pushes[0] = make_bad(payloads[0], xs[0], m)
        for r in k.data_round(pushes):
            msg = error_of(r)
            assert f"LHC key {key}: push from node {node}" in msg, msg
            for text in expect:
                text = text(m) if callable(text) else text
                assert text in msg, (text, msg)
        # the next round of the key works
        xs = sparse_inputs(rng, n, d, 200)
        m, payloads = agreed_round(k, xs)
        for r in k.data_round([p.tobytes() for p in payloads]):
            assert tc.parse_reply(r)[0]["status"] == 0

    nbytes = k.codecs[0].payload_bytes
    bad_round(lambda p, x, m: p.tobytes()[:-4], f"wrong payload length {nbytes - 4} bytes",
              f"expected {nbytes}")
    bad_round(lambda p, x, m: p.tobytes() + b"\0" * 8, f"wrong payload length {nbytes + 8}")
    bad_round(lambda p, x, m: p.tobytes()[:10], "10 bytes is shorter than the 24-byte LHC header")
    bad_round(lambda p, x, m: payload_with(p, magic=0x12345678), "not an LHC payload",
              "magic 0x12345678")
    bad_round(lambda p, x, m: other_seed.encode(x, m, num_workers=n).tobytes(),
              "LHC configuration mismatch", f"0x{other_seed.fingerprint:x}",
              f"0x{k.codecs[0].fingerprint:x}")
    bad_round(lambda p, x, m: payload_with(p, count=2), "count 2")
    # a scale above the rule's for the agreed max: the int32 sums could overflow
    bad_round(lambda p, x, m: payload_with(p, e=R.scale_exponent(m, n) + 1),
              lambda m: f"scale 2^{R.scale_exponent(m, n) + 1} is not the scale rule's "
                        f"2^{R.scale_exponent(m, n)} for the agreed max |v| ",
              f"and {n} workers: its int32 sums could overflow")
    # the compressor's failure push: the header alone, count 0
    bad_round(lambda p, x, m: payload_with(p, count=0)[:HEADER.size], "could not encode")
    assert cluster.server_alive()


def test_registration_refusals(cluster):
    n = cluster.n
    d = 8_000
    cfg = LhcConfig(capacity=1_000)
    # workers that disagree on the capacity: every round of the key fails, naming both
    key = 44 << 16
    k = ts.Key(cluster, key, d)
    kw = cfg.to_kwargs()
    k.register([kw] * (n - 1) + [dict(kw, lhc_capacity="2000")])
    for r in k.round([struct.pack("<Qd", 0, 1.0)] * n, cmd_type=tc.THC_NORM, dtype=tc.FLOAT64,
                     capacity=2048):
        msg = error_of(r)
        assert f"LHC key {key}: registration refused" in msg, msg
        assert "capacity=2000" in msg and "capacity=1000" in msg, msg
    # malformed values: refused with the kwarg named
    for keyno, bad, text in ((45, {"lhc_capacity": "lots"}, "lhc_capacity=lots"),
                             (46, {"lhc_topk": "1.5"}, "lhc_topk=1.5"),
                             (47, {"lhc_topk_method": "best"}, "lhc_topk_method=best")):
        key = keyno << 16
        k = ts.Key(cluster, key, d)
        k.register([dict(kw, **bad)] * n)
        for r in k.round([struct.pack("<Qd", 0, 1.0)] * n, cmd_type=tc.THC_NORM,
                         dtype=tc.FLOAT64, capacity=2048):
            msg = error_of(r)
            assert f"LHC key {key}: registration refused" in msg and text in msg, msg
    # THC on one worker, LHC on the others: refused by the path of the first to arrive
    key = 48 << 16
    k = ts.Key(cluster, key, d)
    k.register([kw] * (n - 1) + [ThcConfig().to_kwargs()])
    for r in k.round([struct.pack("<Qd", 0, 1.0)] * n, cmd_type=tc.THC_NORM, dtype=tc.FLOAT64,
                     capacity=2048):
        msg = error_of(r)
        assert re.search(rf"(LHC|THC) key {key}: registration refused: compressor_type=(thc|lhc) "
                         r"but other workers declared (LHC|THC)", msg), msg
    assert cluster.server_alive()


# ---- fuzz --------------------------------------------------------------------------------------
def broken_push(rng, good: bytes):
    """A broken variant of a good payload, and a text its refusal must contain."""
    kind = int(rng.integers(0, 6))
    if kind == 0:
        cut = int(rng.integers(0, len(good)))
        return good[:cut], "bytes"
    if kind == 1:
        return good + bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8)), \
            "wrong payload length"
    if kind == 2:
        return payload_with(good, magic=int(rng.integers(0, 2**32)) | 1), "not an LHC payload"
    if kind == 3:
        return payload_with(good, version=int(rng.integers(2, 2**16))), "not an LHC payload"
    if kind == 4:
        return payload_with(good, fp=int(rng.integers(0, 2**63)) * 2 + 1), "mismatch"
    return payload_with(good, count=int(rng.integers(2, 2**32))), "count"


def test_fuzzed_headers_fail_their_round_and_clean_rounds_follow(cluster):
    n, key = cluster.n, 49 << 16
    d = 4_000
    cfg = LhcConfig(capacity=500, seed=11)
    k = LhcKey(cluster, key, d, cfg)
    rng = np.random.default_rng(SEED + n)
    for _ in range(FUZZ_ROUNDS):
        xs = sparse_inputs(rng, n, d, 100)
        m, payloads = agreed_round(k, xs)
        pushes = [p.tobytes() for p in payloads]
        i = int(rng.integers(0, n))
        pushes[i], why = broken_push(rng, pushes[i])
        if pushes[i] == payloads[i].tobytes():
            continue
        replies = k.data_round(pushes)
        msgs = [error_of(r) for r in replies]
        assert len(set(msgs)) == 1, msgs
        assert f"LHC key {key}: push from node {cluster.node_ids[i]}" in msgs[0], msgs[0]
        assert why in msgs[0] or "shorter than the 24-byte" in msgs[0], (why, msgs[0])
        assert cluster.server_alive()
    xs = sparse_inputs(rng, n, d, 100)
    m, payloads = agreed_round(k, xs)
    agg = LhcAggregator(cfg, d, num_workers=n, key=key)
    for p in payloads:
        agg.add(p)
    for r in k.data_round([p.tobytes() for p in payloads]):
        h, body = tc.parse_reply(r)
        assert h["status"] == 0 and np.array_equal(np.frombuffer(body, np.uint8), agg.result())


# ---- the exact fallback round ------------------------------------------------------------------
FALLBACK = 4  # lhcwire::kLhcFallbackRequest
FB_HEADER = struct.Struct("<IIQ")  # magic "LHCF", count, fingerprint
FB_MAGIC = 0x4643484C


def fallback_round(k, values, fp=None, counts=None):
    fp = k.codecs[0].fingerprint if fp is None else fp
    pushes = []
    for i, v in enumerate(values):
        v = np.asarray(v, np.int32)
        count = v.size if counts is None else counts[i]
        pushes.append(FB_HEADER.pack(FB_MAGIC, count, fp) + v.tobytes())
    size = max(len(p) for p in pushes)
    return k.round(pushes, cmd_type=FALLBACK, dtype=tc.FLOAT64, capacity=64 + size + 2048)


def test_overloaded_round_completes_exactly_through_the_fallback_round(cluster):
    """A data round past the sketch's capacity: every worker's decode leaves the same indices
    unresolved; the fallback round sums the workers' values there (int32, mod 2^32) and each
    worker's completed decode is the exact mean, as an unbounded sketch would give."""
    n, key = cluster.n, 50 << 16
    d = 30_000
    cfg = LhcConfig(capacity=300, seed=13)
    k = LhcKey(cluster, key, d, cfg)
    rng = np.random.default_rng(77 + n)
    for rnd in range(2):
        xs = sparse_inputs(rng, n, d, 600)  # a union of about 600 n >> 300
        steps = [codec.step for codec in k.codecs]
        m, payloads = agreed_round(k, xs)
        replies = k.data_round([p.tobytes() for p in payloads])
        totals = [np.frombuffer(tc.parse_reply(r)[1], np.uint8) for r in replies]
        errors = []
        for codec, total in zip(k.codecs, totals):
            with pytest.raises(LhcDecodeError) as info:
                codec.decode(total, m, n)
            errors.append(info.value)
        assert all(np.array_equal(e.unresolved, errors[0].unresolved) for e in errors)
        assert len(errors[0].unresolved) > 0
        values = [codec.fallback_values(errors[0].unresolved) for codec in k.codecs]
        replies = fallback_round(k, values)
        want = np.sum([v.astype(np.int64) for v in values], axis=0).astype(np.int32)
        exact = exact_mean(k, xs, m, steps)
        for codec, err, r in zip(k.codecs, errors, replies):
            h, body = tc.parse_reply(r)
            assert h["status"] == 0, body.decode(errors="replace")
            assert h["num_workers"] == n and h["round"] == rnd + 1
            summed = np.frombuffer(body, np.int32)
            assert np.array_equal(summed, want)
            assert np.array_equal(codec.complete(err, summed, m, n), exact)
    assert cluster.server_alive()


def test_bad_fallback_pushes_fail_the_round_naming_key_and_sender(cluster):
    n, key = cluster.n, 51 << 16
    d = 5_000
    k = LhcKey(cluster, key, d, LhcConfig(capacity=100))
    node = cluster.node_ids[0]
    good = [np.arange(10, dtype=np.int32) * (i + 1) for i in range(n)]

    def bad_round(values, *expect, fp=None, counts=None):
        for r in fallback_round(k, values, fp=fp, counts=counts):
            msg = error_of(r)
            assert f"LHC key {key}: fallback push from node" in msg, msg
            for text in expect:
                assert text in msg, (text, msg)
        for r in fallback_round(k, good):  # the next round works
            h, body = tc.parse_reply(r)
            assert h["status"] == 0 and np.array_equal(np.frombuffer(body, np.int32),
                                                       np.sum(good, axis=0))

    # which push is refused depends on which arrives first
    bad_round([np.arange(11, dtype=np.int32)] + good[1:], "unresolved indices, another worker "
              "sent", "the workers are not in step")
    bad_round(good, "LHC configuration mismatch", fp=12345)
    bad_round(good, f"from node {node}", "count 9 and 56 bytes", counts=[9] + [10] * (n - 1))
    bad_round([np.zeros(d + 1, np.int32)] + good[1:], f"count {d + 1}")
    # a fallback round for a key that is not LHC's
    plain = ts.Key(cluster, 52 << 16, 1000)
    for r in fallback_round(plain, good, fp=0):
        assert "for a key not registered as LHC" in error_of(r)
    assert cluster.server_alive()


def test_stalled_fallback_round_is_named_and_fails(client_exe, tmp_path):
    """Worker 0 pushes its fallback values and pulls; worker 1 never pushes. The stall inspector
    names the missing worker after BYTEPS_THC_STALL_WARN, fails the round for worker 0 after
    BYTEPS_THC_STALL_TIMEOUT, and the server then exits (the cluster cannot go on)."""
    c = tc.Cluster(2, tmp_path, client_exe, tc.server_argv(),
                   extra_env={"BYTEPS_THC_STALL_WARN": "2", "BYTEPS_THC_STALL_TIMEOUT": "6"})
    try:
        c.node_ids = [int(c.clients[i].cmd("hello").split()[2]) for i in range(c.n)]
        key = 60 << 16
        k = LhcKey(c, key, 5_000, LhcConfig(capacity=100))
        values = np.arange(10, dtype=np.int32)
        push = tmp_path / "fallback0.bin"
        push.write_bytes(FB_HEADER.pack(FB_MAGIC, values.size, k.codecs[0].fingerprint)
                         + values.tobytes())
        cmd = tc.command(FALLBACK, tc.FLOAT64)
        c.clients[0].cmd(f"push {key} {cmd} {push}")
        pulled = tmp_path / "pull0.bin"
        c.clients[0].cmd(f"pull {key} {cmd} 8192 {pulled}", timeout=120)
        msg = error_of(pulled.read_bytes())
        assert f"LHC key {key}, fallback round 1: waited " in msg, msg
        missing = f"for the push of worker rank 1 (ps-lite node {c.node_ids[1]}, "
        assert missing in msg and "BYTEPS_THC_STALL_TIMEOUT=6" in msg, msg
        deadline = time.monotonic() + 60
        while c.server_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.server.poll() == 1, c.server_text()[-3000:]
        text = c.server_text()
        # the warning came first, naming the same worker
        assert re.search(r"fallback round 1: waited \d+ s for the push of worker rank 1", text), \
            text[-3000:]
        assert "BYTEPS_THC_STALL_WARN=2" in text, text[-3000:]
    finally:
        c.close()
