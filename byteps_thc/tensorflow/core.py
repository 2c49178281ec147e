"""The collectives of the TensorFlow adapter: compressors, stable names, declare, push_pull and
broadcast (byteps_thc.tensorflow re-exports the public API; its docstring says how they behave).

`byteps.tensorflow.ops` is imported only when a function needs it (`_ops`), so that this module
can be imported, and tested, without a BytePS build.
"""
from __future__ import annotations

import re
import threading
import weakref
from typing import Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from .. import compression as _c
from .. import waits as _waits
from ..compression import Compressor
from ..forklib import ForkLib
from .folding import not_constant as _not_constant

Average = "Average"
Sum = "Sum"

# dtypes the BytePS TF op takes as they are; others travel as a dtype that holds them exactly.
_NATIVE = (tf.int32, tf.int64, tf.float16, tf.float32, tf.float64)


def _ops():
    from byteps.tensorflow import ops  # deferred: byteps.tensorflow imports us
    return ops


def size() -> int:
    return _ops().size()


def rank() -> int:
    return _ops().rank()


# ------------------------------------------------------------------------------------------------
# Compressors (the TensorFlow twins of byteps_thc.torch's; kwargs and from_env are
# byteps_thc.compression's, the same strings on every framework)
# ------------------------------------------------------------------------------------------------
class NoneCompressor(Compressor):
    """No compression. bfloat16 travels as float32, small integer types as int32."""
    name = "none"

    def compress(self, tensor):
        wire = _exact_dtype(tensor.dtype)
        if wire == tensor.dtype:
            return tensor, None
        return tf.cast(tensor, wire), tensor.dtype

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


def _floats_as(wire, tensor):
    """compress() of a compressor whose floating-point tensors travel as `wire`: the tensor cast,
    and its own dtype to cast back to; other tensors as NoneCompressor sends them."""
    if tensor.dtype.is_floating and tensor.dtype != wire:
        return tf.cast(tensor, wire), tensor.dtype
    return NoneCompressor.compress(None, tensor)


class FP16Compressor(Compressor):
    """Casts floating-point gradients to float16 for the push_pull and back (as upstream)."""
    name = "fp16"
    decompress = NoneCompressor.decompress

    def compress(self, tensor):
        return _floats_as(tf.float16, tensor)


class RegistryCompressor(_c.RegistryCompressor):
    """A compressor of BytePS's C++ registry, chosen by kwargs; tensors travel as float32."""
    decompress = NoneCompressor.decompress

    def compress(self, tensor):
        return _floats_as(tf.float32, tensor)

    def is_floating(self, tensor) -> bool:
        return tensor.dtype.is_floating

    def wire_bytes(self, tensor) -> Optional[int]:
        """Bytes of the tensor as BytePS sees it (the float32 copy); None for unknown shapes."""
        n = tensor.shape.num_elements()
        return None if n is None else int(n) * 4


class ThcCompressor(_c.ThcMixin, RegistryCompressor):
    """THC: table indices up, integer sums down (docs/ALGORITHM.md); kwargs = config.to_kwargs()."""


class LhcCompressor(_c.LhcMixin, RegistryCompressor):
    """LHC: bitmap and int32 sketch up, their OR and sum down, the exact sum decoded by peeling
    (docs/LHC.md); kwargs = config.to_kwargs()."""


class Compression(_c.CompressionBase):
    """Optional gradient compression used by DistributedGradientTape, DistributedOptimizer and
    push_pull: `none`, `fp16`, `thc(...)`, BytePS's `onebit()`, `topk(k)`, `randomk(k)`,
    `dithering(k)`, or `from_env()` (what bpslaunch --compressor chose)."""

    none = NoneCompressor()
    fp16 = FP16Compressor()
    _registry_class = RegistryCompressor
    _thc_class = ThcCompressor
    _lhc_class = LhcCompressor


def _resolve(compression) -> Compressor:
    if compression is None:
        return Compression.from_env()
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression()
    if not isinstance(compression, Compressor):
        raise TypeError(f"compression must be a byteps_thc.tensorflow Compressor (e.g. "
                        f"bps.Compression.thc()), not {type(compression).__name__}")
    return compression


def choose(compression) -> _c.Choice:
    """The tape's or optimizer's compressor: the script's explicit choice, else the launcher's."""
    choice = _c.choose(None if compression is None else _resolve(compression),
                       Compression.from_env)
    _c.warn_conflict(choice, rank(), stacklevel=3)  # the script's call of the tape/optimizer
    return choice


def _exact_dtype(dtype):
    """The dtype BytePS's op pushes for `dtype`, holding every value exactly."""
    dtype = tf.as_dtype(dtype)
    if dtype in _NATIVE:
        return dtype
    if dtype == tf.bfloat16:
        return tf.float32
    if dtype.is_floating:
        return tf.float64
    if dtype in (tf.bool, tf.int8, tf.uint8, tf.int16, tf.uint16):
        return tf.int32
    return tf.int64


# ------------------------------------------------------------------------------------------------
# Names: one per variable, stable for the process; declared once each, in order of first use
# ------------------------------------------------------------------------------------------------
class _Names:
    """Variable -> unique BytePS-friendly name, in order of first use (the same on every worker
    running the same program). Held by weak reference: a dead variable's name is not reused."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_id: Dict[int, tuple] = {}
        self._taken: set = set()

    def of(self, variable) -> str:
        with self._lock:
            key = id(variable)
            hit = self._by_id.get(key)
            if hit is not None and hit[0]() is variable:
                return hit[1]
            base = _variable_base_name(variable)
            name, n = base, 0
            while name in self._taken:
                n += 1
                name = f"{base}_{n}"
            self._taken.add(name)
            try:
                ref = weakref.ref(variable)
            except TypeError:
                def ref(v=variable):
                    return v
            self._by_id[key] = (ref, name)
            return name


def _variable_base_name(variable) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", None) or "variable"
    name = re.sub(r":\d+$", "", str(name))
    return re.sub(r"[^A-Za-z0-9_./-]", "_", name)


def _is_variable(x) -> bool:
    if isinstance(x, tf.Variable):
        return True
    try:
        import keras
        return isinstance(x, keras.Variable)
    except (ImportError, AttributeError):
        return False


_NAMES = _Names()
_DECLARED: Dict[str, Optional[Dict[str, str]]] = {}
_DECLARE_LOCK = threading.Lock()


def variable_name(variable) -> str:
    """The stable name byteps-thc gives `variable` (without the Gradient./Parameter. prefix)."""
    return _NAMES.of(variable)


def declared_names() -> List[str]:
    """Every BytePS name this process declared through this module, in declaration order."""
    with _DECLARE_LOCK:
        return list(_DECLARED)


_LR_FILE = None


def learning_rate_file(lr: float = 1.0):
    """The process's `./lr.s` (byteps_thc.compression.LearningRateFile), created on first use:
    by the first declare of a tensor with BytePS's vanilla error feedback (rate 1.0: the kept
    error is carried over unscaled) or by a DistributedOptimizer that sets its rate."""
    global _LR_FILE
    if _LR_FILE is None:
        _LR_FILE = _c.LearningRateFile(lr)
    return _LR_FILE


def set_learning_rate(lr) -> None:
    """Tell BytePS's vanilla error feedback (`--compressor-ef vanilla`) the current learning
    rate; it rescales the kept error by previous / current rate. DistributedOptimizer does this
    at every step; a custom loop with DistributedGradientTape and a schedule calls it. A no-op
    unless a tensor uses vanilla error feedback."""
    if _LR_FILE is not None:
        _LR_FILE.set(float(lr))


def declare(name: str, kwargs: Optional[Mapping[str, str]] = None) -> None:
    """Declare a BytePS tensor name (once), with compressor kwargs when given.

    Declared before the tensor's first push, in the same order on every worker: BytePS assigns
    keys in declaration order and sends the kwargs to the server with the first push.
    """
    with _DECLARE_LOCK:
        if name in _DECLARED:
            if (_DECLARED[name] or None) != (dict(kwargs) if kwargs else None):
                raise ValueError(f"BytePS tensor {name!r} was declared with compressor kwargs "
                                 f"{_DECLARED[name]} and is now used with {dict(kwargs or {})}: "
                                 "use one compression per tensor name")
            return
        lib = _fork_lib()
        # a push_pull the op has waited on for BYTEPS_THC_STALL_WARN is logged, naming the
        # tensor (the op keeps the open waits, thc_waits.h)
        _waits.watch_fork_waits(lib, rank)
        if _c.uses_vanilla_ef(kwargs):
            learning_rate_file()  # BytePS's vanilla EF opens ./lr.s with the compressor
        lib.declare_with_kwargs("byteps_tensorflow_declare_tensor_kwargs", "0092", name, kwargs)
        refusal = lib.compressor_refusal(name)
        if refusal:  # not recorded: every later declare (each push_pull's) raises it again
            raise tf.errors.InvalidArgumentError(None, None, refusal)
        _DECLARED[name] = dict(kwargs) if kwargs else None


def _fork_lib() -> ForkLib:
    return ForkLib(_ops().TF_LIB_CTYPES, "tensorflow")


def fail_cluster(why: str) -> None:
    """Fail this worker's cluster: every push_pull in flight and every later one fails with
    `why`, and BytePS's shutdown no longer waits for the other nodes. The first reason wins."""
    _fork_lib().fail_cluster(why)


def cluster_failure() -> Optional[str]:
    """The reason the cluster failed (fail_cluster, a dead node, a stall), or None."""
    return _fork_lib().cluster_failure()


# ------------------------------------------------------------------------------------------------
# push_pull and broadcast
# ------------------------------------------------------------------------------------------------
def _op_name(name: str) -> str:
    return "BytePSPushPull_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def _push_pull_one(tensor, name: str, compression: Compressor, average: bool):
    """Declare `name` (first use) and push_pull `tensor` under it; average or sum.

    The op averages (`average` attr) on the wire dtype: a THC or LHC pull yields the mean and
    others the sum, which only the fork knows once the tensor's context exists (PushPullScale in
    its thc_stage.h), so the op scales, and an average of a THC tensor costs no pass of its own.
    """
    tensor = tf.convert_to_tensor(tensor)
    declare(name, compression.kwargs(tensor))
    wire, ctx = compression.compress(tensor)
    if not tf.executing_eagerly() and tf.get_static_value(wire) is not None:
        wire = _not_constant(wire, tf.zeros_like(wire))
    reduced = _ops().C_LIB.byteps_push_pull(wire, name=_op_name(name), input_name=name,
                                            average=bool(average))
    return compression.decompress(reduced, ctx)


_BATCHED: Dict[tuple, object] = {}


def push_pull_list(tensors: Sequence, names: Sequence[str], compression: Compressor,
                    average: bool) -> list:
    """push_pull of several tensors, all in flight at once (one tf.function in eager mode)."""
    if not tensors:
        return []
    if not tf.executing_eagerly():
        return [_push_pull_one(t, n, compression, average) for t, n in zip(tensors, names)]
    for t, n in zip(tensors, names):  # declare in this order before anything is traced
        t = tf.convert_to_tensor(t)
        declare(n, compression.kwargs(t))
    key = (tuple(names), repr(compression), bool(average))
    fn = _BATCHED.get(key)
    if fn is None:
        fixed = tuple(names)

        def run(ts):
            return [_push_pull_one(t, n, compression, average) for t, n in zip(ts, fixed)]
        fn = tf.function(run, autograph=False)
        _BATCHED[key] = fn
    return fn([tf.convert_to_tensor(t) for t in tensors])


def push_pull(tensor, scope: str = "", average=None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op=None,
              enable_async: bool = False, name: Optional[str] = None):
    """Average (or sum, `op=Sum` / `average=False`) `tensor` over all workers.

    `name`: the BytePS name; required in eager mode for anything but a variable (whose stable
    name is used). In a tf.function an unnamed tensor is named after its graph tensor.
    IndexedSlices are pushed dense.
    """
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Average if average is None or average else Sum
    if op not in (Average, Sum):
        raise ValueError(f"op={op!r}: byteps-thc supports Average and Sum")
    compression = _resolve(compression)
    if name is None:
        if _is_variable(tensor):
            name = "Tensor." + variable_name(tensor)
        elif tf.executing_eagerly():
            raise ValueError(
                "push_pull of an unnamed tensor in eager mode: pass name= (a stable name, the same "
                "on every worker); without one every call would create a new BytePS key")
        else:
            name = scope + "BytePSPushPull_" + re.sub(r"[^A-Za-z0-9_]", "_", tensor.name)
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tf.convert_to_tensor(tensor)
    with tf.device(device_dense):
        return _push_pull_one(tensor, name, compression,
                              average=(op == Average and not enable_async))


def _broadcast_list(tensors: Sequence, names: Sequence[str], root_rank: int) -> list:
    """Values of `root_rank`: push_pull of the sum with zeros elsewhere, always uncompressed
    (x + 0 is exact), in a dtype that holds every value exactly."""
    me = rank()
    wires, dtypes = [], []
    for t in tensors:
        t = tf.convert_to_tensor(t)
        dtypes.append(t.dtype)
        w = tf.cast(t, _exact_dtype(t.dtype))
        if me == root_rank:
            wires.append(w)
        elif tf.executing_eagerly():
            wires.append(tf.zeros_like(w))
        else:  # zeros that wait for `t` (after the step's updates), never folded to a constant
            wires.append(_not_constant(tf.zeros_like(w), w))
    out = push_pull_list(wires, names, Compression.none, average=False)
    return [tf.cast(o, d) for o, d in zip(out, dtypes)]


def broadcast(tensor, root_rank: int, scope: str = "", name: Optional[str] = None,
              is_variable: bool = True):
    """`root_rank`'s value of `tensor` on every worker (the tensor itself is not changed)."""
    if name is None:
        if _is_variable(tensor):
            name = "Parameter." + variable_name(tensor)
        elif tf.executing_eagerly():
            raise ValueError("broadcast of an unnamed tensor in eager mode: pass name=")
        else:
            name = scope + "BytePSBroadcast_" + re.sub(r"[^A-Za-z0-9_]", "_", tensor.name)
    if size() <= 1:
        return tf.convert_to_tensor(tensor)
    return _broadcast_list([tensor], [name], root_rank)[0]


def broadcast_variables(variables, root_rank: int, scope: str = "", prefix: str = "Parameter."):
    """Assign `root_rank`'s values to `variables` on every worker (model and optimizer variables,
    any dtype). Eager: done on return. In a tf.function: returns the op that does it."""
    variables = [v for v in variables]
    if size() <= 1 or not variables:
        return tf.group() if not tf.executing_eagerly() else None
    names = [prefix + variable_name(v) for v in variables]
    values = _broadcast_list([tf.convert_to_tensor(v) for v in variables], names, root_rank)
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_global_variables(root_rank: int):
    raise RuntimeError("bps.broadcast_global_variables() is TF1 graph API; with TensorFlow 2 use "
                       "bps.broadcast_variables(model.variables, root_rank) or "
                       "bps.BroadcastGlobalVariablesCallback(root_rank) with model.fit")


_ANNOUNCED: set = set()  # gradient name lists already counted by _c.announce


def push_pull_grads(grads: list, sources: list, choice: _c.Choice, average: bool,
                     prefix: str = "Gradient.") -> list:
    """push_pull every gradient under its source's stable name (None gradients stay None)."""
    compression = choice.compressor
    todo, names = [], []
    for i, (g, s) in enumerate(zip(grads, sources)):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        name = variable_name(s) if _is_variable(s) else f"source.{i}"
        todo.append((i, g))
        names.append(prefix + name)
    if tuple(names) not in _ANNOUNCED:  # a new list: say what is in force (first), count it
        _ANNOUNCED.add(tuple(names))
        counts = _c.tally(compression, [tf.convert_to_tensor(g) for _, g in todo])
        _c.announce(choice, counts, rank())
    reduced = push_pull_list([g for _, g in todo], names, compression, average)
    out = list(grads)
    for (i, _), r in zip(todo, reduced):
        out[i] = r
    return out
