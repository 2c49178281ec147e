"""Keras 3 learning-rate callbacks under upstream BytePS's names (byteps.tensorflow.keras.callbacks
takes them from here, patch 0096).

Upstream's read and wrote `optimizer.lr` through `keras.backend.get_value`/`set_value`, neither of
which Keras 3 has. These keep upstream's arguments and schedule and use Keras 3's optimizer:

- the rate is `optimizer.learning_rate`, assigned to its variable (a `LearningRateSchedule` is
  refused: the schedule already sets the rate at every step);
- momentum correction (Goyal et al., "Accurate, Large Minibatch SGD") multiplies the optimizer's
  velocity variables (`optimizer.momentums`: SGD's and RMSprop's, whose velocity carries the
  rate) by new rate / old rate whenever the rate changes. For SGD without Nesterov that is exactly
  upstream's momentum * new / old for one step, which a Keras 3 optimizer cannot take: its
  `momentum` is a Python float, fixed when model.fit traces the train step.
"""
from __future__ import annotations

import warnings

import keras

from .core import size


def _rate(optimizer) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _check_constant_rate(optimizer) -> None:
    lr = optimizer.get_config().get("learning_rate")
    if not isinstance(lr, (int, float)):  # a serialised LearningRateSchedule
        raise ValueError(f"{type(optimizer).__name__}'s learning rate is a schedule "
                         f"({lr.get('class_name', lr) if isinstance(lr, dict) else lr}), which "
                         "sets the rate at every step: use the learning-rate callback with a "
                         "constant rate, or the schedule alone")


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the rate to `initial_lr * multiplier(epoch)` from `start_epoch` up to `end_epoch`
    (exclusive; None: to the end). `multiplier` is a number or a function of the epoch. With
    `staircase=True` (always, for a number) the rate changes at the first batch of each epoch,
    else at every batch, with `epoch + batch / steps_per_epoch` (steps_per_epoch: from model.fit
    when not given). `initial_lr`: the optimizer's rate when training begins, when not given."""

    def __init__(self, multiplier, start_epoch: int = 0, end_epoch=None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch=None, initial_lr=None):
        super().__init__()
        if callable(multiplier):
            self.multiplier = multiplier
            self.staircase = staircase
        else:
            self.multiplier = lambda epoch, m=float(multiplier): m
            self.staircase = True
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.initial_lr = initial_lr
        self.current_epoch = None
        if initial_lr is None:
            warnings.warn("Parameter `initial_lr` will be required in the future",
                          DeprecationWarning, stacklevel=2)

    def _steps(self) -> int:
        steps = (self.params or {}).get("steps")
        if not steps:
            raise ValueError(f"{type(self).__name__}: model.fit did not say how many steps an "
                             "epoch has (a dataset of unknown length); pass steps_per_epoch=")
        return int(steps)

    def _set_rate(self, epoch: float) -> None:
        opt = self.model.optimizer
        old = _rate(opt)
        new = float(self.initial_lr) * float(self.multiplier(epoch))
        if new == old:
            return
        opt.learning_rate = new
        velocities = getattr(opt, "momentums", None) if self.momentum_correction else None
        if velocities and getattr(opt, "momentum", 0) and old != 0:
            for v in velocities:  # the velocity carries the old rate: bring it to the new one
                v.assign(v * (new / old))

    def on_train_begin(self, logs=None):
        _check_constant_rate(self.model.optimizer)
        if self.initial_lr is None:
            self.initial_lr = _rate(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._steps()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        e = self.current_epoch
        if e < self.start_epoch or (self.end_epoch is not None and e >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set_rate(e)
        else:
            self._set_rate(e + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup over `warmup_epochs`: the rate goes from `initial_lr / size()` at the start
    to `initial_lr` at the end of the last warmup epoch, linearly in `epoch + (batch + 1) /
    steps_per_epoch`, and is changed at every batch."""

    def __init__(self, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch=None, verbose: int = 0, initial_lr=None):
        def multiplier(epoch):
            # + one step: the last batch of the warmup reaches initial_lr exactly
            epoch += 1.0 / self.steps_per_epoch
            n = size()
            return (epoch * (n - 1) / warmup_epochs + 1) / n

        super().__init__(multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, initial_lr=initial_lr)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.verbose > 0 and epoch == self.end_epoch - 1:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_rate(self.model.optimizer):g}.")
