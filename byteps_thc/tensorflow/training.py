"""Training with TensorFlow: DistributedGradientTape, the Keras 3 DistributedOptimizer and the
Keras callbacks, over the collectives of byteps_thc.tensorflow.core."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from .. import compression as _c
from .core import (
    Average,
    Compression,
    Sum,
    broadcast_variables,
    choose,
    learning_rate_file,
    push_pull_grads,
    push_pull_list,
    set_learning_rate,
    size,
)


# ------------------------------------------------------------------------------------------------
# DistributedGradientTape
# ------------------------------------------------------------------------------------------------
class _DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns gradients averaged over all workers.

    Everything else (watch, stop_recording, jacobian, ...) is the wrapped tape's; it can also be
    used as the context manager itself: `with bps.DistributedGradientTape(tf.GradientTape()) as t:`.
    """

    def __init__(self, tape, choice, op, prefix):
        self._bps_tape = tape
        self._bps_choice = choice
        self._bps_average = op == Average
        self._bps_prefix = prefix

    def __enter__(self):
        self._bps_tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bps_tape.__exit__(*exc)

    def __getattr__(self, attr):
        return getattr(self._bps_tape, attr)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = self._bps_tape.gradient(target, sources, output_gradients,
                                        unconnected_gradients=unconnected_gradients)
        if size() <= 1:
            return grads
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        reduced = push_pull_grads(flat_grads, flat_sources, self._bps_choice,
                                   self._bps_average, self._bps_prefix)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(gradtape, device_dense: str = "", device_sparse: str = "",
                            compression=None, sparse_as_dense: bool = True, op=Average,
                            prefix: str = "Gradient."):
    """A tape whose gradient() averages the gradients over all workers.

    `compression`: `Compression.thc(...)` etc.; None or `Compression.none`: what `bpslaunch
    --compressor` chose (none without it).
    Each gradient travels under its variable's stable name (`prefix` + variable_name(var)); a
    gradient of a watched plain tensor is named by its position in `sources`. Sparse gradients
    (IndexedSlices) are pushed dense. Works in eager mode and inside tf.function.
    """
    if op not in (Average, Sum):
        raise ValueError(f"op={op!r}: byteps-thc supports Average and Sum")
    return _DistributedGradientTape(gradtape, choose(compression), op, prefix)


# ------------------------------------------------------------------------------------------------
# Keras 3 DistributedOptimizer and callbacks
# ------------------------------------------------------------------------------------------------
class _DistributedKerasOptimizer:
    """Mixed in front of the user's Keras 3 optimizer class: apply() (which apply_gradients and
    model.fit call) averages the gradients over all workers first."""

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if grads and size() > 1:
            if _c.uses_vanilla_ef(getattr(self._bps_compression, "_kwargs", None)):
                self._bps_set_learning_rate()
            if trainable_variables is None:
                variables = list(self._trainable_variables)
            else:
                trainable_variables = list(trainable_variables)
                variables = trainable_variables
            grads = push_pull_grads(grads, variables, self._bps_choice,
                                     self._bps_average, self._bps_prefix)
        return super().apply(grads, trainable_variables)


    def _bps_set_learning_rate(self):
        """./lr.s for BytePS's vanilla error feedback: the rate of this step (a schedule's
        value at the current iteration), written before the gradients are pushed."""
        learning_rate_file()
        if tf.executing_eagerly():
            set_learning_rate(self.learning_rate)
        else:  # inside tf.function (model.fit): a Python call at every run of the graph
            tf.py_function(lambda lr: set_learning_rate(lr.numpy()),
                           [tf.convert_to_tensor(self.learning_rate)], [])


def DistributedOptimizer(optimizer, name: Optional[str] = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "", compression=None,
                         sparse_as_dense: bool = True, backward_passes_per_step: int = 1,
                         op=Average, prefix: str = "Gradient."):
    """Wrap a Keras 3 optimizer: every apply()/apply_gradients() (custom loops and model.fit)
    first averages the gradients over all workers, each under its variable's stable name.

    Wrap the optimizer before it is built (it is re-created from its config); the result is an
    instance of a subclass of the optimizer's class with the same class name, so saved models
    load without BytePS. With model.fit, compile with `jit_compile=False` on GPU machines (the
    BytePS op has no XLA kernel). `compression`: None or `Compression.none`: what `bpslaunch
    --compressor` chose (none without it).
    """
    import keras
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"{type(optimizer).__name__} is not a Keras 3 optimizer "
                         "(keras.optimizers.Optimizer); for other training loops use "
                         "bps.DistributedGradientTape")
    if backward_passes_per_step != 1:
        raise ValueError("backward_passes_per_step > 1: use the Keras optimizer's own "
                         "gradient_accumulation_steps")
    if op not in (Average, Sum):
        raise ValueError(f"op={op!r}: byteps-thc supports Average and Sum")
    base = type(optimizer)
    if isinstance(optimizer, _DistributedKerasOptimizer):
        raise ValueError("the optimizer is already a DistributedOptimizer")
    cls = type(base.__name__, (_DistributedKerasOptimizer, base),
               {"__module__": base.__module__, "__qualname__": base.__qualname__})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    opt = cls.from_config(config)
    opt._bps_choice = choose(compression)
    opt._bps_compression = opt._bps_choice.compressor
    opt._bps_average = op == Average
    opt._bps_prefix = prefix
    return opt


def _keras_callback_base():
    import keras
    return keras.callbacks.Callback


class BroadcastGlobalVariablesCallback(_keras_callback_base()):
    """Keras callback: at the start of training, every worker takes `root_rank`'s model (and
    built optimizer) variables, so that all workers start from the same state."""

    def __init__(self, root_rank: int = 0, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device

    def on_train_begin(self, logs=None):
        if size() <= 1:
            return
        with tf.device(self.device):
            broadcast_variables(self.model.variables, self.root_rank)
            opt = getattr(self.model, "optimizer", None)
            if opt is not None and getattr(opt, "built", False):
                broadcast_variables(opt.variables, self.root_rank)


class MetricAverageCallback(_keras_callback_base()):
    """Keras callback: epoch-end metrics (logs) averaged over all workers."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or size() <= 1:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float)))
        if not keys:
            return
        values = [tf.constant(float(logs[k]), tf.float64) for k in keys]
        out = push_pull_list(values, ["Metric." + k for k in keys], Compression.none, True)
        for k, v in zip(keys, out):
            logs[k] = float(v.numpy())
