"""The advisor's command line: which compressor makes a step of BytePS training fastest?

    python -m byteps_thc.advisor --model-bytes 102M --bandwidth 10 --compute-ms 174 --workers 8
    python -m byteps_thc.advisor --model resnet50 --bandwidth 1,10,25 --compute-ms 174
    python -m byteps_thc.advisor --model vgg16 --bandwidth 10 --costs c.json   # costs from a file
    python -m byteps_thc.advisor --model ncf --bandwidth 10        # sparse tables: LHC's case
    python -m byteps_thc.advisor --model-bytes 400M --density 0.002 --bandwidth 10 --compute-ms 20

LHC's bytes and work follow the nonzero fraction of the gradients: a known model's description
gives it (models.EMBEDDINGS: the rows a Zipf batch touches), `--density` states it (every
tensor's, per worker; the workers' supports taken as independent), and top-k LHC (lhc-topk-F)
fixes it. Plain `lhc` is sized for the scenario and shown with its capacity (lhc-cN: pass
`--lhc-capacity N` to bpslaunch).

(`python -m byteps_thc.advise`, the former name, runs this too.)
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Optional, Sequence

from . import host
from .costs import load_costs
from .models import MODELS, densities, model_tensors
from .predict import (
    DEFAULT_EFFICIENCY,
    Prediction,
    Scenario,
    default_specs,
    predict,
    recommend,
)
from .wire import parse_spec

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "ki": 1024, "mi": 1 << 20, "gi": 1 << 30}


def parse_bytes(text: str) -> int:
    """'102M', '97.5MiB', '25e6', '4096000' -> bytes (K/M/G: powers of 1000, Ki/Mi/Gi: of 1024)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmg]i?)?b?\s*", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 102M, 97.5MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def format_table(preds: Sequence[Prediction]) -> str:
    rows = [f"{'compressor':<16}{'step ms':>9}{'speedup':>9}{'net ms':>8}{'cpu w/s ms':>12}"
            f"{'MB up':>8}{'MB down':>9}  bound"]
    for p in preds:
        rows.append(f"{p.compressor:<16}{p.step_s * 1e3:>9.1f}{p.speedup:>8.2f}x"
                    f"{p.network_s * 1e3:>8.1f}{p.worker_cpu_s * 1e3:>6.0f}/"
                    f"{p.server_cpu_s * 1e3:<5.0f}"
                    f"{p.up_bytes / 1e6:>8.2f}{p.down_bytes / 1e6:>9.2f}  {p.bound}")
    return "\n".join(rows)


def _left_out(sc: Scenario, costs, workers: int) -> list:
    """The default LHC specs predict() left out of `sc`, each with the reason."""
    out = []
    for s in default_specs(workers):
        if s.name != "lhc":
            continue
        if not costs.has_lhc:
            out.append(f"{s.label} (the costs have no LHC codec figures)")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m byteps_thc.advisor",
        description="Predict the step time of BytePS training per compressor and say which wins.",
        epilog="Models: " + "; ".join(f"{k}: {v[3]}" for k, v in MODELS.items()))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--model-bytes", type=parse_bytes, metavar="BYTES",
                   help="float32 gradient bytes per step, e.g. 102M (all in large tensors)")
    g.add_argument("--model", choices=sorted(MODELS), help="a known model's real tensor shapes")
    ap.add_argument("--bandwidth", required=True, metavar="GBIT",
                    help="line rate of each machine's link, Gbit/s (comma-separated for several)")
    ap.add_argument("--compute-ms", type=float, default=None,
                    help="forward+backward time per step (default: the model's published figure)")
    ap.add_argument("--density", type=float, default=None, metavar="F",
                    help="nonzero fraction of every gradient of one worker, in [0, 1] (default: "
                         "the model's description; dense without one)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                    help=f"usable fraction of the line rate ({DEFAULT_EFFICIENCY})")
    ap.add_argument("--shared-host-cores", type=int, default=None, metavar="C",
                    help="all processes share one host of C cores (an emulated cluster)")
    ap.add_argument("--compressors", default=None,
                    help="comma-separated, e.g. none,fp16,thc,thc-n,onebit+ef,topk-0.01+ef")
    ap.add_argument("--refresh-costs", action="store_true", help="re-measure this host's costs")
    ap.add_argument("--costs", metavar="PATH", default=None,
                    help="per-element costs from this JSON file (the cache's format) instead of "
                         "this host's")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    if a.model:
        tensors = model_tensors(a.model)
        compute_ms = a.compute_ms if a.compute_ms is not None else MODELS[a.model][1]
    else:
        tensors = [max(1, a.model_bytes // 4)]
        if a.compute_ms is None:
            ap.error("--compute-ms is needed with --model-bytes")
        compute_ms = a.compute_ms
    dens = union = None
    if a.density is not None:
        if not 0.0 <= a.density <= 1.0:
            ap.error(f"--density {a.density!r} must lie in [0, 1] (the fraction of a worker's "
                     "gradient values that are nonzero; 0.01 for 1%)")
        dens = [a.density] * len(tensors)
    elif a.model and densities(a.model, a.workers):
        dens, union = densities(a.model, a.workers)
    specs = (None if a.compressors is None else
             [parse_spec(s, a.workers) for s in a.compressors.split(",") if s.strip()])
    costs = load_costs(a.costs) if a.costs else host.host_costs(refresh=a.refresh_costs)
    out = []
    for bw in [float(b) for b in str(a.bandwidth).split(",")]:
        sc = Scenario(tensors, bw, compute_ms / 1e3, a.workers, a.servers, a.efficiency,
                      a.shared_host_cores, density=dens, union_density=union)
        preds = predict(sc, specs, costs)
        left = [] if specs is not None else _left_out(sc, costs, a.workers)
        if a.json:
            out.append({"bandwidth_gbit": bw, "predictions": [p.as_dict() for p in preds],
                        "advice": recommend(preds)})
            continue
        sparse = "" if dens is None else \
            f", {sum(r * t for r, t in zip(dens, tensors)) / sum(tensors):.2%} nonzero"
        print(f"\n{sum(tensors) * 4 / 1e6:.1f} MB of gradients{sparse}, {a.workers} workers, "
              f"{bw:g} Gbit/s, compute {compute_ms:g} ms")
        print(format_table(preds))
        print(recommend(preds))
        if left:
            print("left out: " + "; ".join(left))
    if a.json:
        print(json.dumps({"costs_source": costs.source, "runs": out}, indent=1))
    else:
        print(f"\n(costs per element measured on this host: {costs.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
