"""bpslaunch's command line: the flags, their checks, and the environment they give the workers.

The compression flags only add environment (byteps_thc.env names it): the workers' side
(byteps_thc.thc.config, byteps_thc.torch...) reads it back. Each homomorphic codec of
byteps_thc.codecs has its `--<codec>-*` flags, generated from its entry, and its variables are
written by its configuration's to_env(), the one serialisation of that configuration.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from .. import codecs, env
from ..thc import ThcConfig

COMPRESSORS = env.COMPRESSORS

# Defaults shown in the help come from where they live: the settings and the config classes.
_MIN_BYTES = env.MIN_COMPRESS_BYTES.default


def flag_name(codec: codecs.Codec, flag: codecs.Flag) -> str:
    return f"--{codec.name}-{flag.field.replace('_', '-')}"


def flag_help(codec: codecs.Codec, flag: codecs.Flag) -> str:
    """The flag's help line, its "{default}" the config class's default of the field."""
    if flag.switch:
        return flag.help
    return flag.help.format(default=getattr(codec.config_class(), flag.field))


def _codec_epilog() -> str:
    """The help's lines of every codec's flags: flag, variable, meaning."""
    lines = []
    for codec in codecs.CODECS.values():
        lines.append(f"  {'--compressor ' + codec.name:<21} {env.COMPRESSOR.name}={codec.name} "
                     f"and the BYTEPS_{codec.label}_* variables below")
        for flag in codec.flags:
            if flag.switch:
                name, var = flag_name(codec, flag), codec.settings["error_feedback"].name + "=0"
            else:
                name = f"{flag_name(codec, flag)} {flag.metavar}"
                var = codec.settings[flag.field].name
            lines.append(f"  {name + ' ':<22}{var + ' ':<27}{flag_help(codec, flag)}")
    return "\n".join(lines)


HELP_EPILOG = f"""\
compression (reaches every worker as environment; byteps.torch.DistributedOptimizer uses it when
no `compression=` argument is given):
{_codec_epilog()}
  --compressor-k K      BYTEPS_COMPRESSOR_K        k of topk/randomk (count or fraction),
                                                   dithering's levels
  --compressor-ef vanilla  BYTEPS_COMPRESSOR_EF    error feedback for onebit/topk/randomk/dithering
  Tensors smaller than BYTEPS_MIN_COMPRESS_BYTES (default {_MIN_BYTES}) are sent uncompressed.

environment read by BytePS and this launcher (set them for a real multi-machine cluster):
  DMLC_ROLE              worker | server | scheduler (required without --local)
  DMLC_NUM_WORKER        number of worker machines
  DMLC_NUM_SERVER        number of servers
  DMLC_PS_ROOT_URI       IP address of the scheduler
  DMLC_PS_ROOT_PORT      port of the scheduler
  DMLC_WORKER_ID         this worker's index, 0..DMLC_NUM_WORKER-1 (workers)
  DMLC_NODE_HOST         address this process announces (else DMLC_INTERFACE's / the first one)
  DMLC_INTERFACE         network interface to use
  DMLC_NODE_PORT         port this server/worker binds (our ps-lite; unset = any free one)
  NVIDIA_VISIBLE_DEVICES GPUs of this machine: one worker process each (default 1 process)
  BYTEPS_LOCAL_SIZE      worker processes on this machine (default: one per GPU, else 1)
  BYTEPS_LOCAL_RANK      set by the launcher for each worker process
  BYTEPS_FORCE_DISTRIBUTED=1   use the servers even with one worker
  BYTEPS_PARTITION_BYTES       tensor partition size (default {env.PARTITION_BYTES.default})
  BYTEPS_MIN_COMPRESS_BYTES    smallest tensor that is compressed (default {_MIN_BYTES})
  BYTEPS_THREADPOOL_SIZE       compression threads per worker (compression needs it; the
                               launcher sets it when a compressor is chosen or with --local)
  BYTEPS_SERVER_ENGINE_THREAD  server summation threads (default 4)
  BYTEPS_SOCKET_PATH           directory of BytePS's local UNIX sockets
  BYTEPS_NUMA_ON=1             pin each local worker to CPUs with numactl (off by default)
  BYTEPS_VISIBLE_CPU_CORES     explicit CPU lists per local worker, e.g. 0-3:4-7
  BYTEPS_LOG_LEVEL             TRACE | DEBUG | INFO | WARNING (default) | ERROR | FATAL
  BYTEPS_ENABLE_GDB=1          run each worker under gdb
  BYTEPS_ENABLE_ASYNC=1        asynchronous training (DistributedOptimizer, uncompressed)
  BYTEPS_THC_DEAD_NODE_TIMEOUT  seconds without a heartbeat before a node counts as dead
                               (default {env.DEAD_NODE_TIMEOUT.default}, 0 = off): bpslaunch sets
                               PS_HEARTBEAT_TIMEOUT to it and PS_HEARTBEAT_INTERVAL to a tenth
                               of it, unless set. Workers then fail their push_pulls naming the
                               dead node and exit 1; servers and the scheduler exit 1.
  BYTEPS_THC_STALL_WARN        a THC round waiting this long is logged by the server with the
                               workers that have not pushed (default {env.STALL_WARN.default:g} s)
  BYTEPS_THC_STALL_TIMEOUT     ... and failed after this long, the server then exiting 1
                               (default 0 = never; --stall-timeout)
  BYTEPS_TRACE_ON=1            write each worker's communication timeline to
                               BYTEPS_TRACE_DIR/<rank>/comm.json (bpslaunch creates the
                               folders; default {env.TRACE_DIR.default}), of each tensor's
                               steps BYTEPS_TRACE_START_STEP ({env.TRACE_START_STEP.default})
                               to BYTEPS_TRACE_END_STEP ({env.TRACE_END_STEP.default})

examples:
  bpslaunch --local 2 --compressor thc -- python example/pytorch/train_digits.py
  bpslaunch --local 4 --servers 2 --compressor thc --thc-bits 3 --thc-granularity 16 \\
      -- python train.py
  DMLC_ROLE=server DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=10.0.0.1 \\
      DMLC_PS_ROOT_PORT=9000 bpslaunch
"""


# ------------------------------------------------------------------------------------------------
# Flag types: env's parsers, their ValueError as argparse's error
# ------------------------------------------------------------------------------------------------
def _flag_type(parse: Callable[[str], object], name: str) -> Callable[[str], object]:
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = name
    return convert


_positive_int = _flag_type(env.parse_positive_int, "positive_int")


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bpslaunch",
        usage="bpslaunch [--local N [--servers M]] [--compressor NAME [...]] [--] CMD [ARG ...]",
        description="Launch a BytePS role (from DMLC_* environment) or, with --local N, a whole "
                    "cluster on this machine; optionally with gradient compression (THC).",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c = p.add_argument_group("compression")
    c.add_argument("--compressor", choices=COMPRESSORS, default=None,
                   help="gradient compressor for every tensor large enough (default: none, or "
                        "$BYTEPS_COMPRESSOR)")
    for codec in codecs.CODECS.values():  # dest: "<codec>_<field>"
        for flag in codec.flags:
            text = f"{codec.label}: {flag_help(codec, flag)}"
            if flag.switch:
                c.add_argument(flag_name(codec, flag), action="store_true", help=text)
                continue
            kind = flag.type
            if kind is not None and kind not in (int, float):
                kind = _flag_type(kind, kind.__name__)
            c.add_argument(flag_name(codec, flag), type=kind, metavar=flag.metavar,
                           choices=flag.choices, default=None, help=text)
    c.add_argument("--compressor-k", metavar="K",
                   help="k for topk/randomk (count or fraction) and dithering (levels)")
    c.add_argument("--compressor-ef", choices=("none", "vanilla"), default=None,
                   help="error feedback for BytePS's own compressors")

    lc = p.add_argument_group("local cluster")
    lc.add_argument("--local", type=_positive_int, metavar="N",
                    help="start scheduler, servers and N workers on 127.0.0.1 and run CMD in each "
                         "worker")
    lc.add_argument("--servers", type=_positive_int, metavar="M", default=None,
                    help="number of servers with --local (default 1)")
    lc.add_argument("--timeout", type=_seconds, metavar="SEC", default=None,
                    help="stop the cluster and fail after SEC seconds")
    lc.add_argument("--grace", type=_seconds, metavar="SEC", default=60.0,
                    help="how long the other workers may run on after one worker finished "
                         "before the cluster counts as hung (default 60)")
    lc.add_argument("--no-prefix", action="store_true",
                    help="do not prefix output lines with the process name")
    lv = p.add_argument_group("liveness")
    lv.add_argument("--stall-timeout", type=_seconds, metavar="SEC", default=None,
                    help="the server fails a THC round that has waited SEC seconds for some "
                         "workers' pushes, and every worker waiting for it gets the error "
                         "(BYTEPS_THC_STALL_TIMEOUT; give it to the servers' bpslaunch)")
    sc = p.add_argument_group("security (docs/SECURITY.md)")
    sc.add_argument("--new-cluster-key", metavar="FILE", default=None,
                    help="write a new cluster key to FILE (mode 0600) and exit")
    sc.add_argument("--cluster-key", metavar="FILE", default=None,
                    help="every connection of the launched nodes is authenticated and encrypted "
                         "with this key (BYTEPS_THC_CLUSTER_KEY); every node needs the same file")
    sc.add_argument("--secure", action="store_true",
                    help="with --local N: a fresh cluster key for this cluster alone")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the training command, run in every worker")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse flags; the command is everything after `--` (or after the first non-flag word)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" in argv:
        i = argv.index("--")
        ns = parser.parse_args(argv[:i])
        if ns.command:
            parser.error(f"unexpected words before '--': {' '.join(ns.command)}")
        ns.command = argv[i + 1:]
    else:
        ns = parser.parse_args(argv)
        ns.command = list(ns.command)
    for codec in codecs.CODECS.values():  # a codec's flag selects it, and is refused with another
        given = _given_flags(ns, codec)
        if not given:
            continue
        if ns.compressor is None:
            ns.compressor = codec.name
        elif ns.compressor != codec.name:
            parser.error(f"{flag_name(codec, given[0])} needs --compressor {codec.name}, "
                         f"not {ns.compressor}")
    if ns.compressor_k is not None and ns.compressor not in ("topk", "randomk", "dithering"):
        parser.error("--compressor-k applies to --compressor topk, randomk or dithering")
    if ns.compressor in ("topk", "randomk", "dithering") and ns.compressor_k is None:
        parser.error(f"--compressor {ns.compressor} needs --compressor-k")
    if ns.new_cluster_key is not None and (ns.command or ns.local is not None or ns.cluster_key
                                           or ns.secure):
        parser.error("--new-cluster-key FILE writes a key and exits; then launch every node "
                     "with --cluster-key FILE")
    if ns.secure and ns.local is None:
        parser.error("--secure needs --local N (a real cluster's nodes share a key file: "
                     "--new-cluster-key FILE, then --cluster-key FILE on every node)")
    if ns.secure and ns.cluster_key:
        parser.error("--secure makes a key of its own: give --cluster-key FILE or --secure")
    if ns.servers is not None and ns.local is None:
        parser.error("--servers needs --local N")
    if ns.local is not None and not ns.command:
        parser.error("--local needs a command: bpslaunch --local N [...] -- CMD ...")
    codec = codecs.CODECS.get(ns.compressor)
    if codec is not None:
        try:
            codec_config(ns)  # validates the combination (table exists, lanes fit) before launch
        except ValueError as e:
            parser.error(f"invalid {codec.label} configuration: {e}")
    return ns


def _given_flags(ns: argparse.Namespace, codec: codecs.Codec) -> list:
    """The codec's flags given on the command line, in the order of codec.flags."""
    return [f for f in codec.flags if getattr(ns, f"{codec.name}_{f.field}") not in (None, False)]


def _codec_env(ns: argparse.Namespace, codec: codecs.Codec,
               environ: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The codec's variables already in the environment, with its flags' values over them (a
    number as its repr, exact for a float; a word as it is)."""
    names = {s.name for s in codec.settings.values()}
    out = {k: v for k, v in (os.environ if environ is None else environ).items() if k in names}
    for flag in _given_flags(ns, codec):
        if flag.switch:
            out[codec.settings["error_feedback"].name] = "0"
        else:
            v = getattr(ns, f"{codec.name}_{flag.field}")
            out[codec.settings[flag.field].name] = v if isinstance(v, str) else repr(v)
    return out


def codec_config(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None):
    """The configuration of the codec `--compressor` names that its flags describe, on top of
    its variables already in the environment (None when the compressor is no codec). With
    --local N, the configuration must serve N workers."""
    codec = codecs.CODECS.get(ns.compressor)
    if codec is None:
        return None
    cfg = codec.from_env(_codec_env(ns, codec, environ))
    if ns.local is not None and codec.check_workers is not None:
        codec.check_workers(cfg, ns.local)
    return cfg


def thc_config(ns: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> ThcConfig:
    """The ThcConfig the flags describe, on top of any BYTEPS_THC_* already in the environment."""
    return codec_config(argparse.Namespace(**dict(vars(ns), compressor="thc")), environ)


def compression_env(ns: argparse.Namespace,
                    environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables the compression flags add to every worker's environment (nothing if unset)."""
    out: Dict[str, str] = {}
    if ns.compressor is None:
        return out
    config = codec_config(ns, environ)
    if config is not None:
        out.update(config.to_env())
    out[env.COMPRESSOR.name] = ns.compressor
    out[env.COMPRESSOR_SET_BY.name] = "bpslaunch"  # the workers' "what is in force" line says so
    if ns.compressor_k is not None:
        out[env.COMPRESSOR_K.name] = str(ns.compressor_k)
    if ns.compressor_ef is not None:
        out[env.COMPRESSOR_EF.name] = ns.compressor_ef
    return out


def liveness_env(ns: argparse.Namespace, environ: Mapping[str, str]) -> Dict[str, str]:
    """ps-lite's heartbeat variables for BYTEPS_THC_DEAD_NODE_TIMEOUT (each only where unset:
    the user's PS_HEARTBEAT_* win), BYTEPS_THC_STARTUP_TIMEOUT (its default where unset: ps-lite
    reads it, and waits without a limit where it is unset) and --stall-timeout; ValueError names
    a bad value."""
    out: Dict[str, str] = {}
    startup = env.STARTUP_TIMEOUT.get(environ)
    if not env.STARTUP_TIMEOUT.is_set(environ):
        out[env.STARTUP_TIMEOUT.name] = str(startup)
    # Both are always set (0: off), since ps-lite has defaults of its own for a node started
    # without bpslaunch (liveness.cc), which BYTEPS_THC_DEAD_NODE_TIMEOUT=0 must turn off too.
    timeout = env.HEARTBEAT_TIMEOUT.get(environ)
    if timeout is None:
        timeout = env.DEAD_NODE_TIMEOUT.get(environ)
        out[env.HEARTBEAT_TIMEOUT.name] = str(timeout or 0)
    if env.HEARTBEAT_INTERVAL.get(environ) is None:
        # one heartbeat a tenth of the timeout (at least 1 s): a live node counts as dead only
        # after about ten in a row went missing (three at the 3 s minimum)
        out[env.HEARTBEAT_INTERVAL.name] = str(max(1, timeout // 10) if timeout else 0)
    if getattr(ns, "stall_timeout", None) is not None:
        out[env.STALL_TIMEOUT.name] = f"{ns.stall_timeout:g}"
    env.STALL_WARN.get(environ)  # validated here, read by the server
    env.STALL_TIMEOUT.get(dict(environ, **out))
    return out


def trace_dirs(environ: Mapping[str, str], ranks: Sequence[int]) -> List[str]:
    """With BYTEPS_TRACE_ON=1, create BYTEPS_TRACE_DIR/<rank>/ for each of `ranks` (BytePS's
    global worker ranks; the fork writes <rank>/comm.json there, patch 0062) and return them;
    else nothing. ValueError names a step range BytePS would abort on."""
    if env.TRACE_ON.get(environ) != "1":
        return []
    start, end = env.TRACE_START_STEP.get(environ), env.TRACE_END_STEP.get(environ)
    if end <= start:
        raise ValueError(f"{env.TRACE_END_STEP.name}={end} must be larger than "
                         f"{env.TRACE_START_STEP.name}={start}")
    base = env.TRACE_DIR.get(environ)
    dirs = [os.path.join(base, str(r)) for r in ranks]
    try:
        for d in dirs:
            os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{env.TRACE_DIR.name}={base!r}: cannot create {e.filename}: "
                         f"{e.strerror}") from None
    return dirs
