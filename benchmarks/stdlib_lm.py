"""The time-to-accuracy task of benchmarks/bench_tta.py: a byte-level transformer language model
trained on the Python standard library's own sources.

Why this corpus: it is on every machine that runs the project (the interpreter's own
`sysconfig.get_paths()["stdlib"]`), so nothing is downloaded, and it is real, varied text (code,
comments, docstrings, tests) of some 30 MB, far more than a run reads: the held-out loss measures
generalisation, not memorisation. Why this model: bytes need no tokenizer (a vocabulary of 256),
and a few million parameters in a handful of large matrices is what gradient compression is for
(every weight matrix is above BytePS's 64 KiB compression threshold) while a step of a few
hundred tokens stays short enough on a CPU core that a 1 Gbit/s link decides a good part of it.

Fixed rules, so that every run and every machine with the same Python sees the same text:
- the files: every `*.py` under the standard library, none under site-packages or dist-packages,
  in sorted order of their path relative to it;
- the split: a file is held out when the SHA-256 of its relative path (POSIX form), read as an
  integer, is 0 modulo HELDOUT_MODULUS (about 5% of the files; whole files, so that no held-out
  text is a neighbour of training text);
- the training batches: rank r draws window starts from a torch.Generator seeded with
  seed * 1000 + r, the same sequence in every run;
- the held-out set: `eval_windows` windows at evenly spaced starts of the held-out text.

Imports torch only (no BytePS, no torch.distributed): the BytePS and DDP workers of bench_tta.py
wrap the same model, data and loop.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import statistics
import sys
import sysconfig
import time
from typing import Callable, List, Optional, Sequence

HELDOUT_MODULUS = 20
_SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")


# ------------------------------------------------------------------------------------------------
# Corpus
# ------------------------------------------------------------------------------------------------
def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def corpus_files(root: Optional[str] = None) -> List[str]:
    """The corpus's files: relative POSIX paths under `root` (the standard library), sorted."""
    root = root or stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for f in filenames:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                out.append(rel.replace(os.sep, "/"))
    if not out:
        raise FileNotFoundError(f"no *.py files under {root!r}: not a Python standard library")
    return sorted(out)


def is_heldout(rel_path: str) -> bool:
    """The split rule (module docstring): whole files, by the hash of their relative path."""
    h = int.from_bytes(hashlib.sha256(rel_path.encode("utf-8")).digest(), "big")
    return h % HELDOUT_MODULUS == 0


@dataclasses.dataclass
class Corpus:
    train: bytes
    heldout: bytes
    files_train: int
    files_heldout: int
    root: str
    digest: str     # SHA-256 prefix of both texts: equal digests, equal corpora

    def info(self) -> dict:
        return {"root": self.root, "python": sys.version.split()[0],
                "files_train": self.files_train, "files_heldout": self.files_heldout,
                "bytes_train": len(self.train), "bytes_heldout": len(self.heldout),
                "digest": self.digest}


def load_corpus(root: Optional[str] = None) -> Corpus:
    """Both texts: each a concatenation of its files' bytes in sorted order, each file followed
    by a NUL byte (which no source file holds) marking where one file ends."""
    root = root or stdlib_root()
    parts = {True: [], False: []}
    for rel in corpus_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            parts[is_heldout(rel)].append(f.read() + b"\0")
    train, heldout = b"".join(parts[False]), b"".join(parts[True])
    if not train or not heldout:
        raise ValueError(f"the split of {root!r} left an empty side: {len(parts[False])} "
                         f"training and {len(parts[True])} held-out files")
    h = hashlib.sha256(train)
    h.update(heldout)
    return Corpus(train, heldout, len(parts[False]), len(parts[True]), root, h.hexdigest()[:16])


# ------------------------------------------------------------------------------------------------
# Model
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LmConfig:
    dim: int = 256      # 3,323,392 parameters with the other defaults (13.3 MB of float32)
    layers: int = 4
    heads: int = 4
    seq: int = 128
    mlp_ratio: int = 4

    def __post_init__(self):
        for name in ("dim", "layers", "heads", "seq", "mlp_ratio"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"LmConfig.{name} must be a positive integer, got {v!r}")
        if self.dim % self.heads:
            raise ValueError(f"LmConfig.dim {self.dim} is not a multiple of heads {self.heads}")


def make_model(cfg: LmConfig, seed: int = 0):
    """The model, initialised from `seed` alone (every rank builds the same weights)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
            self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
            self.proj = nn.Linear(cfg.dim, cfg.dim)
            self.fc1 = nn.Linear(cfg.dim, cfg.mlp_ratio * cfg.dim)
            self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.dim, cfg.dim)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, cfg.heads, d // cfg.heads).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class ByteLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(256, cfg.dim)
            self.pos = nn.Embedding(cfg.seq, cfg.dim)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.ln = nn.LayerNorm(cfg.dim)
            self.head = nn.Linear(cfg.dim, 256, bias=False)

        def forward(self, x, y):
            """Mean cross entropy (nats per byte) of predicting y from x (both [batch, seq])."""
            h = self.tok(x) + self.pos.weight[: x.shape[1]]
            for blk in self.blocks:
                h = blk(h)
            logits = self.head(self.ln(h))
            return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))

    torch.manual_seed(seed)
    model = ByteLM()
    for name, p in model.named_parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
    return model


# ------------------------------------------------------------------------------------------------
# Data and the loop
# ------------------------------------------------------------------------------------------------
class Batches:
    """This rank's training windows and the fixed held-out windows (module docstring)."""

    def __init__(self, corpus: Corpus, seq: int, batch: int, rank: int, seed: int = 0,
                 eval_windows: int = 32):
        import torch
        if batch < 1 or eval_windows < 1:
            raise ValueError(f"batch {batch} and eval_windows {eval_windows} must be positive")
        self.seq, self.batch = seq, batch
        self.train = torch.frombuffer(bytearray(corpus.train), dtype=torch.uint8)
        held = torch.frombuffer(bytearray(corpus.heldout), dtype=torch.uint8)
        span = len(held) - seq - 1
        if span < eval_windows or len(self.train) <= seq + 1:
            raise ValueError(f"windows of {seq} bytes do not fit the corpus")
        starts = torch.tensor([i * span // eval_windows for i in range(eval_windows)])
        self.eval_x, self.eval_y = self._windows(held, starts)
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)

    def _windows(self, text, starts):
        import torch
        idx = starts[:, None] + torch.arange(self.seq + 1)[None, :]
        w = text[idx].long()
        return w[:, :-1], w[:, 1:]

    def next(self):
        import torch
        starts = torch.randint(0, len(self.train) - self.seq - 1, (self.batch,),
                               generator=self.gen)
        return self._windows(self.train, starts)


def evaluate(net, data: Batches, chunk: int = 16) -> float:
    """Mean held-out loss (nats per byte) over the fixed windows."""
    import torch
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(data.eval_x), chunk):
            x, y = data.eval_x[i:i + chunk], data.eval_y[i:i + chunk]
            total += net(x, y).item() * len(x)
            n += len(x)
    return total / n


def train(step_model, eval_net, opt, data: Batches, steps: int, eval_every: int,
          on_eval: Optional[Callable[[list], None]] = None) -> dict:
    """`steps` optimiser steps on `data` (`step_model` is what the step calls: a DDP wrapper or
    the module; `eval_net` is what is evaluated), the held-out loss at step 0, every `eval_every`
    steps and at the end. The clock runs only during training steps: `wall_s` of a curve point is
    the training time before it, evaluations excluded (they cost every run the same). Returns the
    curve [[wall_s, step, val_loss], ...], every step's time and training loss."""
    if steps < 1 or eval_every < 1:
        raise ValueError(f"steps {steps} and eval_every {eval_every} must be positive")
    curve: List[list] = []
    times: List[float] = []
    losses: List[float] = []
    clock = 0.0

    def point(step):
        curve.append([round(clock, 4), step, evaluate(eval_net, data)])
        if on_eval:
            on_eval(curve[-1])

    point(0)
    for step in range(1, steps + 1):
        x, y = data.next()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_model(x, y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t
        clock += dt
        times.append(dt)
        losses.append(loss.item())
        if step % eval_every == 0 or step == steps:
            point(step)
    return {"curve": curve, "step_times_s": times, "train_losses": losses,
            "step_s": statistics.median(times), "wall_s": clock}


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def time_to_target(curve: Sequence[Sequence[float]], target: Optional[float]):
    """(wall_s, step) of the first curve point at or below `target`, or (None, None): the
    time at the resolution of the evaluations (the first evaluation that saw it)."""
    if target is None or (isinstance(target, float) and math.isnan(target)):
        return None, None
    for wall, step, loss in curve:
        if loss <= target:
            return wall, step
    return None, None
