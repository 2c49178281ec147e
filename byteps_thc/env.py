"""Every environment variable the Python side of byteps-thc reads: its name, default and parser.

Each variable is one `Setting`; `Setting.get(environ)` is the one helper that reads and parses it,
and names the variable and the bad value when it does not parse. Nothing else in the package
spells a variable's name or default: the launcher, the framework adapters, the advisor and the
tests all import them from here.

THC's own settings (`THC`) default to None, meaning "ThcConfig's default": the dataclass is the
one place where THC's default hyper-parameters live.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Dict, Mapping, Optional


# ------------------------------------------------------------------------------------------------
# Parsers: str -> value, raising ValueError with what is expected
# ------------------------------------------------------------------------------------------------
def parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None


def parse_nonnegative_int(text: str) -> int:
    v = parse_int(text)
    if v < 0:
        raise ValueError(f"{text!r} must be at least 0")
    return v


def parse_positive_int(text: str) -> int:
    v = parse_int(text)
    if v < 1:
        raise ValueError(f"{text!r} must be at least 1")
    return v


def parse_probability(text: str) -> float:
    """A probability strictly between 0 and 1, as a decimal or a fraction (0.03125, 1/32)."""
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            v = float(num) / float(den)
        else:
            v = float(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{text!r} is not a probability (e.g. 0.03125 or 1/32)") from None
    if not 0.0 < v < 1.0:
        raise ValueError(f"{text!r} must lie strictly between 0 and 1")
    return v


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


def parse_seconds(text: str) -> float:
    """A number of seconds, at least 0 (0 usually means "never")."""
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not 0.0 <= v < 1e7:
        raise ValueError(f"{text!r} must be at least 0 seconds")
    return v


def parse_dead_node_timeout(text: str) -> int:
    """0 (no detection) or whole seconds >= 3: heartbeats come every second at the fastest, and
    a live node must be able to miss at least two in a row."""
    v = parse_nonnegative_int(text)
    if 0 < v < 3:
        raise ValueError(f"{text!r} must be 0 (off) or at least 3 seconds")
    return v


def parse_startup_timeout(text: str) -> int:
    """0 (wait without a limit) or whole seconds up to a day (what ps-lite accepts)."""
    v = parse_nonnegative_int(text)
    if v > 86400:
        raise ValueError(f"{text!r} must be at most 86400 seconds (0 = no limit)")
    return v


def parse_optional_int(text: str) -> Optional[int]:
    """An integer where 0 means "unset" (None)."""
    return parse_int(text) or None


def parse_name(text: str) -> str:
    return text.strip().lower()


def parse_choice(*names: str) -> Callable[[str], str]:
    """A parser of one of `names` (case and surrounding space ignored)."""
    def parse(text: str) -> str:
        name = parse_name(text)
        if name not in names:
            raise ValueError(f"{text!r} is not one of {', '.join(names)}")
        return name
    return parse


# ------------------------------------------------------------------------------------------------
# Settings
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    default: object
    parse: Callable[[str], object]
    help: str

    def get(self, environ: Optional[Mapping[str, str]] = None):
        """The parsed value in `environ` (default os.environ); `default` when unset or empty."""
        env = os.environ if environ is None else environ
        raw = env.get(self.name)
        if raw is None or not raw.strip():
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError as e:
            raise ValueError(f"{self.name}={raw!r} is not valid: {e}") from None

    def is_set(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        env = os.environ if environ is None else environ
        return bool((env.get(self.name) or "").strip())


# Compression, as bpslaunch's flags set it and the adapters read it
COMPRESSORS = ("none", "thc", "lhc", "fp16", "onebit", "topk", "randomk", "dithering")
COMPRESSOR = Setting("BYTEPS_COMPRESSOR", "none", parse_choice(*COMPRESSORS),
                     " | ".join(COMPRESSORS))
COMPRESSOR_SET_BY = Setting("BYTEPS_COMPRESSOR_SET_BY", None, parse_choice("bpslaunch"),
                            "bpslaunch: BYTEPS_COMPRESSOR comes from bpslaunch --compressor "
                            "(the launcher sets it; unset: from the environment)")
COMPRESSOR_K = Setting("BYTEPS_COMPRESSOR_K", None, str,
                       "k of topk/randomk (count or fraction), dithering's levels")
COMPRESSOR_EF = Setting("BYTEPS_COMPRESSOR_EF", "none", parse_choice("none", "vanilla"),
                        "none | vanilla: error feedback of BytePS's own compressors")
MIN_COMPRESS_BYTES = Setting("BYTEPS_MIN_COMPRESS_BYTES", 65536, parse_nonnegative_int,
                             "smallest tensor (bytes as pushed) that is compressed")
PARTITION_BYTES = Setting("BYTEPS_PARTITION_BYTES", 4096000, parse_positive_int,
                          "tensor partition size in bytes")

# THC hyper-parameters, keyed by ThcConfig field (None: ThcConfig's default)
THC_BITS = Setting("BYTEPS_THC_BITS", None, parse_int,
                   "bits per coordinate on the way up (1..8)")
THC_GRANULARITY = Setting("BYTEPS_THC_GRANULARITY", None, parse_int,
                          "table values in [0, G], G >= 2^B - 1")
THC_OVERFLOW_PROB = Setting("BYTEPS_THC_OVERFLOW_PROB", None, parse_probability,
                            "clipped probability mass, e.g. 1/32")
THC_SEED = Setting("BYTEPS_THC_SEED", None, parse_nonnegative_int,
                   "rotation seed, the same on every worker")
THC_ROTATION_BLOCK = Setting("BYTEPS_THC_ROTATION_BLOCK", None, parse_optional_int,
                             "Hadamard block, a power of two (0: tiled per partition, "
                             "<= 5% padding)")
THC_ERROR_FEEDBACK = Setting("BYTEPS_THC_ERROR_FEEDBACK", None, parse_bool,
                             "1 | 0: THC's error feedback")
THC_NONFINITE = Setting("BYTEPS_THC_NONFINITE", "propagate", parse_choice("propagate", "error"),
                        "propagate | error: a NaN/Inf gradient in a THC partition makes that "
                        "step's result NaN/inf on every worker (as uncompressed), or raises")
THC_CODEC_THREADS = Setting("BYTEPS_THC_CODEC_THREADS", 1, parse_positive_int,
                            "threads of one THC partition's encode and decode on a CPU worker "
                            "(1: BytePS's BYTEPS_THREADPOOL_SIZE threads already compress "
                            "partitions in parallel; more where cores stay idle)")
THC: Dict[str, Setting] = {
    "bits": THC_BITS,
    "granularity": THC_GRANULARITY,
    "overflow_prob": THC_OVERFLOW_PROB,
    "seed": THC_SEED,
    "rotation_block": THC_ROTATION_BLOCK,
    "error_feedback": THC_ERROR_FEEDBACK,
}


def parse_topk(text: str) -> Optional[float]:
    """0 or none: no sparsifier; else a fraction in (0, 1] (LhcConfig checks the range)."""
    if text.lower() in ("0", "none", "off"):
        return None
    return float(text)


# LHC hyper-parameters, keyed by LhcConfig field (None: LhcConfig's default). The non-finite mode
# is THC's BYTEPS_THC_NONFINITE (the same max round decides it).
LHC_CAPACITY = Setting("BYTEPS_LHC_CAPACITY", None, parse_positive_int,
                       "the most nonzeros of one partition's summed gradient (sizes the sketch)")
LHC_TOPK = Setting("BYTEPS_LHC_TOPK", None, parse_topk,
                   "fraction each worker keeps per partition (0 = none: the input as it is)")
LHC_TOPK_METHOD = Setting("BYTEPS_LHC_TOPK_METHOD", None, parse_choice("exact", "sampled"),
                          "exact | sampled: exact top-k, or a threshold from 1024 samples")
LHC_SEED = Setting("BYTEPS_LHC_SEED", None, parse_nonnegative_int,
                   "hash seed, the same on every worker")
LHC_ERROR_FEEDBACK = Setting("BYTEPS_LHC_ERROR_FEEDBACK", None, parse_bool,
                             "1 | 0: keep what top-k dropped for the next step")
LHC: Dict[str, Setting] = {
    "capacity": LHC_CAPACITY,
    "topk": LHC_TOPK,
    "topk_method": LHC_TOPK_METHOD,
    "seed": LHC_SEED,
    "error_feedback": LHC_ERROR_FEEDBACK,
}

# The cluster: ps-lite's and BytePS's own variables, as the launcher sets and checks them
ROLE = Setting("DMLC_ROLE", None, parse_name, "worker | server | scheduler")
NUM_WORKER = Setting("DMLC_NUM_WORKER", 1, parse_positive_int, "number of worker machines")
NUM_SERVER = Setting("DMLC_NUM_SERVER", None, parse_positive_int, "number of servers")
PS_ROOT_URI = Setting("DMLC_PS_ROOT_URI", None, str, "IP address of the scheduler")
PS_ROOT_PORT = Setting("DMLC_PS_ROOT_PORT", None, parse_positive_int, "port of the scheduler")
WORKER_ID = Setting("DMLC_WORKER_ID", 0, parse_nonnegative_int,
                    "this worker's index, 0..DMLC_NUM_WORKER-1")
NODE_HOST = Setting("DMLC_NODE_HOST", None, str,
                    "address this process announces (else DMLC_INTERFACE's)")
INTERFACE = Setting("DMLC_INTERFACE", None, str, "network interface to use")
NODE_PORT = Setting("DMLC_NODE_PORT", None, parse_positive_int,
                    "port this server/worker binds (unset: any free one)")
VISIBLE_DEVICES = Setting("NVIDIA_VISIBLE_DEVICES", None, str,
                          "GPUs of this machine: one worker process each")
LOCAL_SIZE = Setting("BYTEPS_LOCAL_SIZE", None, parse_positive_int,
                     "worker processes on this machine (default: one per GPU, else 1)")
LOCAL_RANK = Setting("BYTEPS_LOCAL_RANK", 0, parse_nonnegative_int,
                     "set by the launcher for each worker process")
GLOBAL_RANK = Setting("BYTEPS_GLOBAL_RANK", None, parse_nonnegative_int, "set by BytePS")
FORCE_DISTRIBUTED = Setting("BYTEPS_FORCE_DISTRIBUTED", False, parse_bool,
                            "use the servers even with one worker")
THREADPOOL_SIZE = Setting("BYTEPS_THREADPOOL_SIZE", None, parse_nonnegative_int,
                          "compression threads per worker (the launcher sets it)")
SOCKET_PATH = Setting("BYTEPS_SOCKET_PATH", None, str,
                      "directory of BytePS's local UNIX sockets")
NUMA_ON = Setting("BYTEPS_NUMA_ON", False, parse_bool,
                  "pin each local worker to CPUs with numactl")
VISIBLE_CPU_CORES = Setting("BYTEPS_VISIBLE_CPU_CORES", None, str,
                            "explicit CPU lists per local worker, e.g. 0-3:4-7")
ENABLE_GDB = Setting("BYTEPS_ENABLE_GDB", False, parse_bool, "run each worker under gdb")
ENABLE_ASYNC = Setting("BYTEPS_ENABLE_ASYNC", False, parse_bool,
                       "asynchronous training: workers push parameter changes, uncompressed")
TRACE_ON = Setting("BYTEPS_TRACE_ON", "0", parse_choice("0", "1"),
                   "write each worker's communication timeline to "
                   "BYTEPS_TRACE_DIR/<rank>/comm.json")
TRACE_DIR = Setting("BYTEPS_TRACE_DIR", "./trace", str,
                    "folder of the timelines (bpslaunch creates <rank>/ in it for each worker)")
TRACE_START_STEP = Setting("BYTEPS_TRACE_START_STEP", 10, parse_positive_int,
                           "first traced step of each tensor")
TRACE_END_STEP = Setting("BYTEPS_TRACE_END_STEP", 20, parse_positive_int,
                         "the step of each tensor at which the timeline is written")

# Liveness: dead nodes (ps-lite's heartbeats) and stalled rounds (the server's stall inspector)
DEAD_NODE_TIMEOUT = Setting("BYTEPS_THC_DEAD_NODE_TIMEOUT", 30, parse_dead_node_timeout,
                            "seconds without a heartbeat before a node counts as dead (0 = off); "
                            "bpslaunch sets PS_HEARTBEAT_TIMEOUT to it and PS_HEARTBEAT_INTERVAL "
                            "to a tenth of it (at least 1) where they are unset")
HEARTBEAT_INTERVAL = Setting("PS_HEARTBEAT_INTERVAL", None, parse_nonnegative_int,
                             "ps-lite: seconds between a node's heartbeats to the scheduler")
HEARTBEAT_TIMEOUT = Setting("PS_HEARTBEAT_TIMEOUT", None, parse_nonnegative_int,
                            "ps-lite: seconds of silence after which a node counts as dead")
STARTUP_TIMEOUT = Setting("BYTEPS_THC_STARTUP_TIMEOUT", 300, parse_startup_timeout,
                          "seconds every node waits for the cluster to form (all nodes "
                          "registered with the scheduler) before it names the missing ones and "
                          "exits with status 1 (0 = no limit); bpslaunch passes it to ps-lite, "
                          "whose default where unset is the same")
STALL_WARN = Setting("BYTEPS_THC_STALL_WARN", 60.0, parse_seconds,
                     "seconds a THC round may wait before the server names the workers that "
                     "have not pushed (0 = never)")
STALL_TIMEOUT = Setting("BYTEPS_THC_STALL_TIMEOUT", 0.0, parse_seconds,
                        "seconds after which the server fails a waiting THC round, and then "
                        "exits, ending the cluster (0 = never; bpslaunch --stall-timeout)")

# Security: the cluster key (ZeroMQ CURVE on every ps-lite connection; launch/cluster_key.py)
CLUSTER_KEY = Setting("BYTEPS_THC_CLUSTER_KEY", None, str,
                      "path of the cluster key file (bpslaunch --new-cluster-key FILE, mode "
                      "0600): every connection of the node is authenticated and encrypted with "
                      "it; unset: plaintext, any peer that reaches a port may join")

# Variables a local cluster decides itself (whatever the caller's environment says is dropped)
CLUSTER_OWNED = tuple(s.name for s in (
    ROLE, WORKER_ID, NUM_WORKER, NUM_SERVER, PS_ROOT_URI, PS_ROOT_PORT, NODE_HOST, INTERFACE,
    NODE_PORT, LOCAL_RANK, LOCAL_SIZE, GLOBAL_RANK, SOCKET_PATH, VISIBLE_DEVICES,
    VISIBLE_CPU_CORES))


def available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threadpool_size(num_local_workers: int, cpus: Optional[int] = None) -> int:
    """BYTEPS_THREADPOOL_SIZE for one of `num_local_workers` workers sharing this host: its share
    of the CPUs, at least 1 and at most 4 (BytePS's compression threads)."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, min(4, cpus // max(1, num_local_workers)))
