"""A fuzz of the server's THC path: the real BytePS scheduler and server (the fork build) and two
real ps-lite clients (harness/thc_client.cc), as in test_thc_server.py.

For FUZZ_ROUNDS norm rounds and FUZZ_ROUNDS data rounds on a registered THC key, at least one
worker per round sends something broken (random lengths and bytes, truncated headers, wrong
magic or version, wrong fingerprints, out-of-range and huge lengths, a ps-lite length field that
disagrees with the bytes); the others send well-formed pushes. Checked after every round:

- the server process is up;
- every pull of the round gets the same error reply, whose message names the key, the node of a
  broken push and what was wrong with it (the wire format of thc_wire.h, not the server's code,
  says what each case must be refused for);
- the key's round counter moved on by one.

Then a clean norm round returns the max and clean data rounds sum bit for bit like
byteps_thc.ThcAggregator, and an uncompressed key and a second THC key, driven between the
fuzzed rounds, sum correctly throughout. The registration (compressor kwargs) is fuzzed too, on
fresh keys: malformed values and malformed serialisations are refused with a message naming them.

Everything random comes from numpy's generator seeded with SEED (THC_TEST_FUZZ_SEED overrides it),
so a failure reproduces; FUZZ_ROUNDS (THC_TEST_FUZZ_ROUNDS) sets the length of the run.
"""
from __future__ import annotations

import os
import re
import struct

import numpy as np
import pytest

import test_thc_server as ts
from byteps_thc import ThcConfig
from harness import pslite as tc

pytestmark = pytest.mark.needs_fork("server")

SEED = int(os.environ.get("THC_TEST_FUZZ_SEED", "20261201"))
FUZZ_ROUNDS = int(os.environ.get("THC_TEST_FUZZ_ROUNDS", "200"))
N = 2          # workers
D = 5000       # elements of the fuzzed key: padded to 8192, 4096 payload bytes at 4 bits
MIB = 1 << 20
INT_MAX = 2 ** 31 - 1


@pytest.fixture(scope="module")
def cluster(client_exe, tmp_path_factory):
    c = tc.Cluster(N, tmp_path_factory.mktemp("fuzz"), client_exe, tc.server_argv())
    # node ids, by rank (clients[i] has rank i)
    c.node_ids = [int(c.clients[i].cmd("hello").split()[2]) for i in range(N)]
    yield c
    c.close()


def raw_round(k, pushes, cmd_type, dtype, capacity):
    """Like Key.round, but each push is (bytes, lens field or None): None pushes plainly, a
    number sends that as ps-lite's length field whatever the bytes are (client `rawpush`)."""
    cmd = tc.command(cmd_type, dtype)
    lines, pulls, outs = [], [], []
    for i, (data, lens) in enumerate(pushes):
        p = k.dir / f"fuzz{i}.bin"
        p.write_bytes(data)
        lines.append(f"push {k.key} {cmd} {p}" if lens is None
                     else f"rawpush {k.key} {cmd} {lens} {p}")
        o = k.dir / f"fuzzpull{i}.bin"
        outs.append(o)
        pulls.append(f"pull {k.key} {cmd} {capacity} {o}")
    k.c.all(lines, timeout=120)
    k.c.all(pulls, timeout=120)
    return [o.read_bytes() for o in outs]


# ---- what a broken push is refused for (the wire format of thc_wire.h) --------------------------
def data_refusal(payload: bytes, fp: int, expect_len: int):
    """The phrase the server's message must hold for this data push, or None if well-formed."""
    if len(payload) < 16:
        return f"{len(payload)} bytes is shorter than the 16-byte THC header"
    magic, version, got_fp = struct.unpack_from("<IIQ", payload)
    if magic != tc.PUSH_MAGIC or version != tc.WIRE_VERSION:
        return f"not a THC payload (magic {magic:#x}, version {version})"
    if got_fp != fp:
        return f"THC configuration mismatch (fingerprint {got_fp:#x}"
    if len(payload) != expect_len:
        return f"wrong payload length {len(payload)} bytes, expected {expect_len}"
    return None


def norm_refusal(payload: bytes, fp: int):
    if len(payload) != 16:
        return f"has {len(payload)} bytes, expected 16"
    got_fp, _ = struct.unpack("<Qd", payload)
    if got_fp != fp:
        return f"THC configuration mismatch (fingerprint {got_fp:#x}"
    return None


def rand_bytes(rng, n):
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def other_u32(rng, not_this):
    v = int(rng.integers(0, 2 ** 32))
    return v if v != not_this else (v + 1) % 2 ** 32


def other_u64(rng, not_this):
    v = int(rng.integers(0, 2 ** 63)) * 2 + int(rng.integers(0, 2))
    return v if v != not_this else v ^ 1


def bad_data_push(rng, fp, nbytes):
    """One broken data push (bytes) for a key whose pushes are 16 + nbytes bytes."""
    hdr = ts.header(fp)
    body = rand_bytes(rng, nbytes)
    kind = rng.choice(["random", "truncated", "magic", "version", "fingerprint", "length",
                       "huge", "empty"], p=[.2, .1, .1, .1, .15, .25, .05, .05])
    if kind == "random":
        return rand_bytes(rng, int(rng.integers(0, 3 * (16 + nbytes))))
    if kind == "truncated":
        return hdr[:int(rng.integers(1, 16))]
    if kind == "magic":
        return struct.pack("<IIQ", other_u32(rng, tc.PUSH_MAGIC), tc.WIRE_VERSION, fp) + body
    if kind == "version":
        return struct.pack("<IIQ", tc.PUSH_MAGIC, other_u32(rng, tc.WIRE_VERSION), fp) + body
    if kind == "fingerprint":
        return struct.pack("<IIQ", tc.PUSH_MAGIC, tc.WIRE_VERSION, other_u64(rng, fp)) + body
    if kind == "length":  # near the right length, or anywhere up to twice it
        n = (nbytes + int(rng.choice([-1, 1])) * int(rng.integers(1, 65)) if rng.random() < .5
             else int(rng.integers(0, 2 * nbytes)))
        n = n if n != nbytes else n + 1
        return hdr + rand_bytes(rng, max(0, n))
    if kind == "huge":  # megabytes where kilobytes belong
        return hdr + bytes(int(rng.integers(4 * MIB, 24 * MIB)))
    return b""


def bad_norm_push(rng, fp):
    kind = rng.choice(["random", "short", "long", "fingerprint", "huge", "empty"],
                      p=[.25, .2, .2, .25, .05, .05])
    if kind == "random":
        return rand_bytes(rng, int(rng.integers(0, 64)))
    if kind == "short":
        return struct.pack("<Qd", fp, 1.0)[:int(rng.integers(1, 16))]
    if kind == "long":
        return struct.pack("<Qd", fp, 1.0) + rand_bytes(rng, int(rng.integers(1, 64)))
    if kind == "fingerprint":  # a finite, non-negative norm under a foreign fingerprint
        return struct.pack("<Qd", other_u64(rng, fp), float(rng.random() * 10))
    if kind == "huge":
        return bytes(int(rng.integers(1 * MIB, 8 * MIB)))
    return b""


def lens_field(rng, nbytes):
    """Mostly none (a plain push); sometimes a ps-lite length field out of range for the bytes."""
    if rng.random() < 0.75:
        return None
    return int(rng.choice([-1, 0, 1, INT_MAX, -INT_MAX - 1, nbytes + 1, max(0, nbytes - 1)]))


def check_failed_round(c, replies, key, refusals, want_round, push_kind):
    """Every pull got the same error; it names the key, a broken push's node and its fault."""
    assert c.server_alive(), "the server died:\n" + c.server_text()[-3000:]
    assert all(r == replies[0] for r in replies), "the pulls of one round differ"
    h, body = tc.parse_reply(replies[0])
    msg = body.decode(errors="replace")
    assert h["status"] != 0, f"round {want_round} succeeded despite {refusals}"
    assert h["round"] == want_round, (h["round"], want_round)
    assert f"THC key {key}: {push_kind} from node " in msg, msg
    named = [why for node, why in refusals
             if why is not None and f"from node {node}" in msg and why in msg]
    assert named, f"the message {msg!r} names none of the broken pushes {refusals}"


# ---- the fuzz ------------------------------------------------------------------------------
def test_fuzz_data_and_norm_rounds(cluster):
    c = cluster
    rng = np.random.default_rng(SEED)
    cfg = ThcConfig()
    key = 60 << 16
    k = ts.Key(c, key, D, cfg.to_kwargs())
    fp, nbytes, _ = k.fingerprint()
    # bystanders: a second THC key and an uncompressed key, driven between the fuzzed rounds
    other = ts.Key(c, 61 << 16, 3000, cfg.to_kwargs())
    other_fp, other_bytes, _ = other.fingerprint()
    plain = ts.Key(c, 62 << 16, 1000)
    cap = 16 + 2 * (16 + nbytes) + 2048

    def bystanders():
        payloads = [rand_bytes(rng, other_bytes) for _ in range(N)]
        ts.check_sums(other.round([ts.header(other_fp) + p for p in payloads]), cfg, 3000, N,
                      payloads)
        xs = [rng.integers(-1000, 1000, 1000).astype(np.float32) for _ in range(N)]
        for r in plain.round([x.tobytes() for x in xs], capacity=4000):
            assert np.array_equal(np.frombuffer(r, dtype=np.float32), np.sum(xs, axis=0))

    for rnd in range(1, FUZZ_ROUNDS + 1):
        # which workers break this round: a non-empty subset
        bad = [bool(b) for b in rng.integers(0, 2, N)]
        if not any(bad):
            bad[int(rng.integers(0, N))] = True
        # the norm round
        pushes, refusals = [], []
        for i in range(N):
            data = bad_norm_push(rng, fp) if bad[i] else struct.pack("<Qd", fp, rng.random())
            why = norm_refusal(data, fp)
            pushes.append((data, lens_field(rng, len(data)) if bad[i] else None))
            refusals.append((c.node_ids[i], why))
        assert any(why for _, why in refusals)
        replies = raw_round(k, pushes, tc.THC_NORM, tc.FLOAT64, 2048)
        check_failed_round(c, replies, key, refusals, rnd, "norm push")
        # the data round
        pushes, refusals = [], []
        for i in range(N):
            data = (bad_data_push(rng, fp, nbytes) if bad[i]
                    else ts.header(fp) + rand_bytes(rng, nbytes))
            why = data_refusal(data, fp, 16 + nbytes)
            pushes.append((data, lens_field(rng, len(data)) if bad[i] else None))
            refusals.append((c.node_ids[i], why))
        assert any(why for _, why in refusals)
        replies = raw_round(k, pushes, tc.DEFAULT, tc.FLOAT32, cap)
        check_failed_round(c, replies, key, refusals, rnd, "push")
        if rnd % 25 == 0:
            bystanders()

    # clean rounds afterwards: the max of the norms, then sums like ThcAggregator, for codec
    # payloads, for random (well-formed) indices, and with a length field the bytes overrule
    norms = [float(rng.random() * 5) for _ in range(N)]
    replies = k.round([struct.pack("<Qd", fp, v) for v in norms], cmd_type=tc.THC_NORM,
                      dtype=tc.FLOAT64, capacity=2048)
    for r in replies:
        h, body = tc.parse_reply(r)
        assert h["status"] == 0 and h["round"] == FUZZ_ROUNDS + 1, body
        assert struct.unpack("<d", body)[0] == max(norms)
    payloads = ts.thc_payloads(cfg, D, N, rng)
    replies = k.round([ts.header(fp) + p for p in payloads])
    ts.check_sums(replies, cfg, D, N, payloads)
    assert tc.parse_reply(replies[0])[0]["round"] == FUZZ_ROUNDS + 1
    payloads = [rand_bytes(rng, nbytes) for _ in range(N)]
    ts.check_sums(k.round([ts.header(fp) + p for p in payloads]), cfg, D, N, payloads)
    payloads = [rand_bytes(rng, nbytes) for _ in range(N)]
    replies = raw_round(k, [(ts.header(fp) + p, INT_MAX) for p in payloads], tc.DEFAULT,
                        tc.FLOAT32, cap)
    ts.check_sums(replies, cfg, D, N, payloads)
    bystanders()
    assert c.server_alive()


# ---- the registration ----------------------------------------------------------------------
GOOD = ThcConfig().to_kwargs()


def _named(kwarg, *values):
    """Rows whose refusal names the kwarg and the value as sent."""
    return [(kwarg, v, f"{kwarg}={v}") for v in values]


def _table(changed):
    """The good thc_table with the entries `changed` ({index: text})."""
    entries = GOOD["thc_table"].split(",")
    for i, v in changed.items():
        entries[i] = v
    return ",".join(entries)


BAD_VALUES = [  # (kwarg, value, phrase of the refusal)
    *_named("thc_bits", "0", "9", "-1", "four", "4.5"),
    ("thc_bits", "18446744073709551617", "thc_bits="),
    *_named("thc_granularity", "-30", "3e1", "4294967296"),
    ("thc_granularity", "14", "granularity must be in"),
    ("thc_granularity", "16777216", "granularity must be in"),
    *_named("thc_clip", "nan", "inf", "-2", "0", "1e999", "2.15x"),
    ("thc_clip", "3.0", "does not match thc_overflow_prob"),
    *_named("thc_overflow_prob", "0", "1", "nan"),
    *_named("thc_seed", "-1", "0x2a", "99999999999999999999"),
    *_named("thc_rotation_block", "3", "-8"),
    ("thc_rotation_block", "8589934592", "rotation_block must be at most"),
    ("thc_table", "0,3,5,7", "table must have 2^bits = 16 entries, got 4"),
    ("thc_table", _table({2: "x"}), "'x' is not an unsigned"),
    ("thc_table", _table({2: ""}), "'' is not an unsigned"),
    ("thc_table", _table({1: "5", 2: "3"}), "strictly increasing"),
    ("thc_table", _table({0: "1"}), "table[0] must be 0"),
    ("thc_table", _table({15: "4294967296"}), "4294967296"),
    ("thc_table", _table({15: "31"}), "must equal granularity"),
    *_named("thc_error_feedback", "maybe"),
    ("thc_table", None, "thc_table is missing"),
]
BAD_SERIALISED = [  # the bytes of the registration (BytePS's "N k1 v1 ..."), phrase
    ("99 compressor_type thc thc_bits 4", "registration"),
    ("18446744073709551615 compressor_type thc", "registration"),
    ("-1 compressor_type thc", "registration"),
    ("3 compressor_type thc thc_bits", "registration"),
    # BytePS's own compressors too: its Deserialize would loop 2^64 times under the server's lock
    ("18446744073709551615 compressor_type onebit", "malformed compressor kwargs"),
    ("2 compressor_type topk", "malformed compressor kwargs"),
]


def register_and_check(c, key, per_worker, phrase, payload_fp):
    """Register `key` with per-worker serialised kwargs; every later round of it fails with the
    refusal, the server stays up."""
    k = ts.Key(c, key, 4096)
    for i, text in enumerate(per_worker):
        (k.dir / f"kwargs{i}.txt").write_text(text)
    c.all([f"push {key} {tc.command(tc.COMPRESSED, tc.FLOAT32)} {k.dir / f'kwargs{i}.txt'}"
           for i in range(N)], timeout=30)
    assert c.server_alive(), c.server_text()[-3000:]
    for r in k.round([struct.pack("<Qd", payload_fp, 1.0)] * N, cmd_type=tc.THC_NORM,
                     dtype=tc.FLOAT64, capacity=2048):
        _assert_refused(ts.error_of(r), key, phrase)
    for r in k.round([ts.header(payload_fp) + bytes(2048)] * N):
        _assert_refused(ts.error_of(r), key, phrase)


def _assert_refused(msg, key, phrase):
    """A THC registration's refusal names THC's key; one that names no codec (BytePS's own
    compressors) the BytePS key and the sender."""
    assert re.search(rf"(THC key {key}: registration refused|BytePS key {key}: registration "
                     rf"from node \d+ refused)", msg) and phrase in msg, (phrase, msg)


def test_fuzz_registration(cluster):
    c = cluster
    rng = np.random.default_rng(SEED + 1)
    good = ts.Key(c, 70 << 16, 4096, GOOD)  # a registered key: its fingerprint for the payloads
    fp = good.fingerprint()[0]
    key = 71 << 16
    for kwarg, value, phrase in BAD_VALUES:
        kw = dict(GOOD)
        if value is None:
            kw.pop(kwarg)
        else:
            kw[kwarg] = value
        bad = tc.serialise_kwargs(kw)
        # every worker sends it, or one worker does and the others send the good kwargs
        one = int(rng.integers(-1, N))
        per_worker = [bad if one in (-1, i) else tc.serialise_kwargs(GOOD) for i in range(N)]
        register_and_check(c, key, per_worker, phrase, fp)
        key += 1
    for text, phrase in BAD_SERIALISED:
        register_and_check(c, key, [text] * N, phrase, fp)
        key += 1
    # the registered key still works
    cfg = ThcConfig()
    payloads = ts.thc_payloads(cfg, 4096, N, rng)
    ts.check_sums(good.round([ts.header(fp) + p for p in payloads]), cfg, 4096, N, payloads)
