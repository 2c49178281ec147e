"""Synthetic-data throughput of BytePS training with TensorFlow 2: Keras's ResNet-50 or VGG-16.

    bpslaunch --local 2 -- python example/tensorflow/benchmark_synthetic.py --compressor none
    bpslaunch --local 2 -- python example/tensorflow/benchmark_synthetic.py --compressor thc

The models are keras.applications' (real architectures and parameter shapes, random weights, no
download: ResNet-50 25.6 M parameters, VGG-16 138 M); the images are random and small by default
(--image-size 64, VGG-16 keeps its 224-wide classifier input only at 224), so that the run is
dominated by gradient communication, which is what compression changes. One training step is a
tf.function with bps.DistributedGradientTape. Prints samples/s (per worker and in total) and the
bytes that crossed the loopback interface per step (measured, /proc/net/dev: meaningful when the
cluster is alone on lo). Without a BytePS launcher (no DMLC_ROLE) it measures one process's
compute only.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import tensorflow as tf

from example import common

MODELS = {"resnet50": keras.applications.ResNet50, "vgg16": keras.applications.VGG16}


def main(argv=None):
    args = common.benchmark_parser(__doc__, MODELS).parse_args(argv)
    bps, distributed = common.start("tensorflow")
    rank, size = bps.rank(), bps.size()
    keras.utils.set_random_seed(0)
    model = MODELS[args.model](weights=None, input_shape=(args.image_size, args.image_size, 3),
                               classes=1000)
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    comp = "none (single process)"
    compression = None
    if distributed:
        compression = common.choose_compression(bps, args, bps.Compression.from_env)
        comp = repr(compression)
        bps.broadcast_variables(model.variables, root_rank=0)
    n_params = int(sum(v.numpy().size for v in model.trainable_variables))
    if rank == 0:
        common.print_model(args, n_params, size, comp)
    data = tf.random.normal((args.batch_size, args.image_size, args.image_size, 3), seed=1)
    target = tf.random.uniform((args.batch_size,), 0, 1000, dtype=tf.int64, seed=2)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        if distributed:
            tape = bps.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return common.benchmark(bps, distributed, args, lambda: step().numpy(), comp, n_params)


if __name__ == "__main__":
    sys.exit(main())
