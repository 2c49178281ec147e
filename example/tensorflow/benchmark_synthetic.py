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
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

MODELS = {"resnet50": keras.applications.ResNet50, "vgg16": keras.applications.VGG16}


def loopback_tx_bytes():
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])
    except OSError:
        pass
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    p.add_argument("--batch-size", type=int, default=4, help="per worker")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-warmup", type=int, default=2)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--compressor", choices=("env", "none", "fp16", "thc"), default="env",
                   help="env (default): what bpslaunch --compressor chose")
    p.add_argument("--thc-bits", type=int, default=4)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    distributed = "DMLC_ROLE" in os.environ
    if distributed:
        import byteps.tensorflow as bps
        bps.init()
        rank, size = bps.rank(), bps.size()
    else:
        bps, rank, size = None, 0, 1
    keras.utils.set_random_seed(0)
    model = MODELS[args.model](weights=None, input_shape=(args.image_size, args.image_size, 3),
                               classes=1000)
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    comp = "none (single process)"
    compression = None
    if distributed:
        compression = {"env": bps.Compression.from_env(), "none": bps.Compression.none,
                       "fp16": bps.Compression.fp16}.get(args.compressor)
        if args.compressor == "thc":
            compression = bps.Compression.thc(bits=args.thc_bits)
        comp = repr(compression)
        bps.broadcast_variables(model.variables, root_rank=0)
    n_params = int(sum(v.numpy().size for v in model.trainable_variables))
    if rank == 0:
        print(f"{args.model}: {n_params / 1e6:.1f} M parameters ({n_params * 4 / 2**20:.0f} MiB "
              f"float32), batch {args.batch_size}/worker, {args.image_size}px, {size} worker(s), "
              f"compression {comp}", flush=True)
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

    for _ in range(args.num_warmup):
        step().numpy()
    tx0, t0 = loopback_tx_bytes(), time.perf_counter()
    for i in range(args.num_iters):
        ts = time.perf_counter()
        step().numpy()
        if rank == 0:
            print(f"iter {i + 1}/{args.num_iters}: {args.batch_size / (time.perf_counter() - ts):.2f} "
                  "samples/s per worker", flush=True)
    seconds = time.perf_counter() - t0
    tx1 = loopback_tx_bytes()
    per_worker = args.batch_size * args.num_iters / seconds
    if rank == 0:
        line = (f"RESULT model={args.model} compression={comp} workers={size} "
                f"samples/s per worker={per_worker:.2f} total={per_worker * size:.2f}")
        if distributed and tx0 is not None and tx1 is not None:
            per_step = (tx1 - tx0) / args.num_iters
            line += (f" loopback bytes/step={per_step:.0f} "
                     f"({per_step / (n_params * 4):.3f} x the float32 model)")
        print(line, flush=True)
    if distributed:
        bps.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
