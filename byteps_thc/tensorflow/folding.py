"""A value TensorFlow's constant folding cannot evaluate before the function runs (core's push_pull
of a constant in a traced step)."""
import tensorflow as tf

_FALSE = None  # a bool variable that stays False: a value TF cannot know before it runs


def not_constant(value, other):
    """`value`, computed from a variable read, so that TF's constant folding cannot evaluate it.

    The op is stateless (so that the push_pulls of a traced step run in parallel), so TF would
    fold a push_pull of a constant (a broadcast's zeros, tf.constant(...)): run it once, while it
    optimises the function, before any other op, waiting there for peers that wait for this
    worker's other push_pulls. `other` is never selected; select copies `value` bit for bit."""
    global _FALSE
    if _FALSE is None:
        with tf.init_scope():
            _FALSE = tf.Variable(False, trainable=False, name="byteps_thc_false")
    return tf.where(_FALSE.read_value(), other, value)
