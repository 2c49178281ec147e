"""TensorFlow 2 adapter of byteps-thc: THC (and BytePS's other compressors) for TF 2 and Keras 3.

The patched `byteps.tensorflow` (csrc/byteps/patches/0092-*) takes its training API from here, so
user code stays BytePS's:

    import byteps.tensorflow as bps
    bps.init()
    # custom loop (eager or tf.function)
    with tf.GradientTape() as tape:
        loss = ...
    tape = bps.DistributedGradientTape(tape, compression=bps.Compression.thc(bits=4))
    grads = tape.gradient(loss, model.trainable_variables)
    # or Keras 3 model.fit
    opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=bps.Compression.thc())
    model.compile(optimizer=opt, loss=..., jit_compile=False)
    model.fit(x, y, callbacks=[bps.BroadcastGlobalVariablesCallback(0)])

Without `compression=`, or with `compression=Compression.none` (upstream's default, passed by its
scripts as boilerplate), the tape and the optimizer use what `bpslaunch --compressor ...` chose
(`Compression.from_env()`: BYTEPS_COMPRESSOR and BYTEPS_THC_*; every variable's name and default
is in byteps_thc.env, THC's defaults are ThcConfig's); another explicit choice stays, with one
warning on rank 0 if the launcher chose otherwise. At the first gradient declare rank 0 prints
one line saying what is in force (byteps_thc.compression.announce). `push_pull` itself only
compresses with what it is given.

Names. BytePS keys a tensor by its name, and every worker must declare the same names in the same
order. Here every variable gets one stable name for the life of the process, from its Keras path
(or tf.Variable name), made unique in order of first use: gradients travel as
"Gradient.<name>", broadcasts as "Parameter.<name>". Eager and tf.function use the same names, so a
program can mix them. An unnamed eager `push_pull` of a plain tensor is refused (upstream gave it
a random name per call: a new key and buffer every step); inside tf.function unnamed tensors are
named after their graph tensor, as upstream does.

THC reaches BytePS's C++ compressor registry exactly as in PyTorch: each gradient name is
declared once with the compressor's kwargs (`ThcConfig.to_kwargs()`), and BytePS's worker
pipeline compresses every partition; nothing of THC's math runs in Python. Tensors smaller than
BYTEPS_MIN_COMPRESS_BYTES (env.MIN_COMPRESS_BYTES) travel uncompressed. The average (push_pull's
default, the tape's and the optimizer's) is the fork's op's (its `average` attr): a THC or LHC pull
yields the mean, which it returns as it is, any other the sum, which it divides by the number of
workers (integers: floor, as `//`), in the dtype on the wire.

In eager mode the push_pulls of one gradient list run as one tf.function (cached per list of
names), so all of them are in flight at once, as they are inside a traced train step.

`byteps.tensorflow.ops` is imported only when a function needs it, so that this module (and the
compression objects) can be imported, and tested, without a BytePS build.
"""
from ..thc import ThcConfig  # noqa: F401 - part of this module's namespace (upstream's)
from .core import (
                   Average,
                   Compression,
                   Compressor,
                   FP16Compressor,
                   NoneCompressor,
                   RegistryCompressor,
                   Sum,
                   ThcCompressor,
                   broadcast,
                   broadcast_global_variables,
                   broadcast_variables,
                   cluster_failure,
                   declare,
                   declared_names,
                   fail_cluster,
                   push_pull,
                   rank,
                   set_learning_rate,
                   size,
                   variable_name,
)
from .training import (
                   BroadcastGlobalVariablesCallback,
                   DistributedGradientTape,
                   DistributedOptimizer,
                   MetricAverageCallback,
)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "RegistryCompressor",
           "ThcCompressor", "LhcCompressor", "push_pull", "broadcast", "broadcast_variables",
           "broadcast_global_variables", "DistributedGradientTape", "DistributedOptimizer",
           "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "declare",
           "declared_names", "variable_name", "set_learning_rate", "size", "rank",
           "Average", "Sum", "fail_cluster", "cluster_failure"]
