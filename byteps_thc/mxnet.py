"""MXNet adapter of byteps-thc (optional; mxnet 1.9.1 has its own environment, `make test-mxnet`).

BytePS's MXNet plugin is the one upstream plugin that already declares gradients with compressor
kwargs (`compression_params`, copied onto each parameter as `byteps_*` attributes). THC joins
through the same door, with the kwargs every framework uses (`ThcConfig.to_kwargs()`):

    import byteps.mxnet as bps
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                     compression=bps.Compression.thc(bits=4))
    # or compression_params={"compressor": "thc", "bits": 4}, or `bpslaunch --compressor thc`

Passing nothing (or upstream's `Compression.none`) leaves the choice to the launcher; an explicit
`compression=` or `compression_params=` stays, with one warning on rank 0 when the launcher chose
otherwise, and rank 0 prints one line saying what is in force (byteps_thc.compression, as for
torch and TensorFlow). Parameters smaller than BYTEPS_MIN_COMPRESS_BYTES travel uncompressed
(every variable's name and default is in byteps_thc.env, THC's defaults are ThcConfig's). The
patched `byteps.mxnet` (csrc/byteps/patches/0094-*) takes DistributedTrainer and Compression
from here.
"""
from __future__ import annotations

from typing import Mapping, Optional

from . import codecs, env
from . import compression as _c


class CodecCompression:
    """A homomorphic codec for MXNet (`codec`: its entry of byteps_thc.codecs): the kwargs each
    large float parameter's gradient is declared with, the same as every framework's."""
    codec: codecs.Codec

    def __init__(self, config):
        self.config = self.codec.config(config=config)

    def kwargs(self) -> dict:
        return self.codec.kwargs(self.config)

    def __repr__(self):
        return self.codec.repr(self.config)


_CLASSES = {c.name: type(f"{c.name.capitalize()}Compression", (CodecCompression,),
                         {"codec": c, "name": c.name, "__doc__": f"{c.summary}, for MXNet."})
            for c in codecs.CODECS.values()}
ThcCompression = _CLASSES["thc"]
LhcCompression = _CLASSES["lhc"]


def from_params(compression_params: Optional[Mapping]):
    """A codec's compression from upstream-style `compression_params` ({"compressor": "thc",
    "bits": 4, ...}, {"compressor": "lhc", "capacity": 4096}); None for BytePS's own."""
    name = (compression_params or {}).get("compressor")
    if name not in codecs.CODECS:
        return None
    return _CLASSES[name](codecs.CODECS[name].from_params(compression_params))


def from_env(environ: Optional[Mapping[str, str]] = None):
    """A codec's compression when `bpslaunch --compressor thc|lhc` chose it (BYTEPS_COMPRESSOR
    and the codec's settings); None for anything else (BytePS's own compressors are chosen with
    compression_params)."""
    name = env.COMPRESSOR.get(environ)
    if name not in codecs.CODECS:
        return None
    return _CLASSES[name](codecs.CODECS[name].from_env(environ))


class UpstreamChoice:
    """What upstream's DistributedTrainer does itself: `compression_params` (onebit, topk, fp16,
    ...) or, without them, no compression."""

    def __init__(self, params: Optional[Mapping] = None):
        self.params = dict(params or {})
        self.name = self.params.get("compressor") or ("fp16" if self.params.get("fp16") else "none")

    def __repr__(self):
        return f"compression_params={self.params!r}" if self.params else "Compression.none"


def choose(compression=None, compression_params: Optional[Mapping] = None,
           environ: Optional[Mapping[str, str]] = None) -> _c.Choice:
    """The trainer's compression (byteps_thc.compression.choose): `compression` (None or upstream's
    none: no choice), else THC or upstream's `compression_params`, else the launcher's THC."""
    if compression is None and compression_params:
        compression = from_params(compression_params) or UpstreamChoice(compression_params)
    return _c.choose(compression, lambda: from_env(environ) or UpstreamChoice(), environ)


def _make_trainer():
    """byteps.mxnet's DistributedTrainer with a THC-aware __init__ (the class itself, not a
    subclass: patch 0094 rebinds byteps.mxnet.DistributedTrainer to what this returns, and
    upstream's __init__ calls `super(DistributedTrainer, self)` through that module name, so a
    subclass there would run upstream's __init__ twice and fail on gluon's kvstore argument)."""
    import numpy as np

    from byteps.mxnet import Compression as upstream
    from byteps.mxnet import DistributedTrainer as cls
    from byteps.mxnet import rank

    if getattr(cls, "_byteps_thc", False):
        return cls
    upstream_init = cls.__init__

    def __init__(self, params, optimizer, optimizer_params=None, root_rank=0,
                 compression_params=None, compression=None):
        if compression is upstream.none or isinstance(compression, type(upstream.none)):
            compression = None  # upstream's boilerplate: no choice
        choice = choose(compression, compression_params)
        chosen = choice.compressor
        _c.warn_conflict(choice, rank())
        thc = isinstance(chosen, CodecCompression)  # our kwargs on each param
        if not thc:
            compression_params = chosen.params or None
        gated = chosen.name not in ("none", "fp16")  # registry compressors: size-gated
        threshold = env.MIN_COMPRESS_BYTES.get()
        counts = _c.Tally()
        for _, param in sorted(params.items()):
            if param.grad_req == "null":
                continue
            counts.tensors += 1
            if not gated or np.dtype(param.dtype).kind != "f":
                continue
            shape = param.shape
            if shape is None or any(d <= 0 for d in shape):
                continue  # deferred shape: declared uncompressed
            if int(np.prod(shape)) * 4 < threshold:
                counts.small += 1
                continue
            counts.compressed += 1
            if thc:
                for k, v in chosen.kwargs().items():
                    setattr(param, "byteps_" + k, v)
        self.compression = chosen if thc else None
        upstream_init(self, params, optimizer, optimizer_params, root_rank, compression_params)
        _c.announce(choice, counts, rank())

    __init__.__doc__ = """BytePS's DistributedTrainer, plus THC: `compression=Compression.thc(...)`,
        `compression_params={"compressor": "thc", ...}`, or what `bpslaunch --compressor thc`
        chose. Other compression_params (onebit, topk, ...) work as upstream."""
    cls.__init__ = __init__
    cls._byteps_thc = True
    return cls


def _fork_lib():
    from byteps.mxnet.ops import MXNET_LIB_CTYPES

    from .forklib import ForkLib
    return ForkLib(MXNET_LIB_CTYPES, "mxnet")


def fail_cluster(why: str) -> None:
    """Fail this worker's cluster: every push_pull in flight and every later one raises
    mxnet.base.MXNetError carrying `why` (where its result is read), and BytePS's shutdown no
    longer waits for the other nodes. The first reason wins. Also `byteps.mxnet.fail_cluster`."""
    _fork_lib().fail_cluster(why)


def cluster_failure() -> Optional[str]:
    """The reason the cluster failed (fail_cluster, a dead node, a stall), or None."""
    return _fork_lib().cluster_failure()


def watch_waits() -> None:
    """A push_pull waited on for BYTEPS_THC_STALL_WARN is logged once, naming the tensor
    (byteps_thc.waits). MXNet waits inside its engine, where no Python code of ours runs, so the
    fork's push_pull keeps its open waits (thc_waits.h) and a daemon thread polls them. The
    patched byteps.mxnet calls this on import."""
    from byteps.mxnet import rank

    from . import waits
    waits.watch_fork_waits(_fork_lib(), rank)


def _constructor(codec: codecs.Codec):
    def make(config=None, **params):
        return _CLASSES[codec.name](codec.config(config, **params))
    make.__name__ = make.__qualname__ = codec.name
    make.__doc__ = (f"{codec.summary}; with a ready `config`, or with `params` "
                    f"({codec.config_class.__name__}'s fields; its defaults for the others).")
    return make


class Compression:
    """The homomorphic codecs for byteps.mxnet, `Compression.thc(...)`, `Compression.lhc(...)`
    (BytePS's own compressors are chosen with compression_params)."""
    from_env = staticmethod(from_env)


for _codec in codecs.CODECS.values():
    setattr(Compression, _codec.name, staticmethod(_constructor(_codec)))
thc = Compression.thc
lhc = Compression.lhc


def __getattr__(name):  # DistributedTrainer needs mxnet and byteps.mxnet: built on first use
    if name == "DistributedTrainer":
        cls = _make_trainer()
        globals()["DistributedTrainer"] = cls
        return cls
    raise AttributeError(name)
