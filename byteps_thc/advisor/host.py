"""This host's costs: measured once (per-element timings, then calibration clusters of the real
stack where BytePS is installed) and cached in ~/.cache/byteps_thc/advise-costs.json.

    from byteps_thc.advisor import host, models, predict
    preds = predict.predict(predict.Scenario(tensors=models.model_tensors("resnet50"),
                                             bandwidth_gbit=10, compute_s=0.174, workers=8),
                            None, host.host_costs())

The calibration clusters (`bpslaunch --local 2`, loopback, about two minutes;
byteps_thc.advisor.calibrate) price the stack and, per compressor, what its real code costs beyond
the per-element figures (`<c>_xw` per element on a worker, `<c>_xs` per element and push on the
server: the real C++ of top-k, random-k, dithering and 1-bit against their stand-ins, BytePS's THC
stages against the codec timed alone; measured at k=0.01, 8 levels, with error feedback, 2
workers).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

from . import calibrate
from .costs import COST_CACHE, COST_KEYS, HostCosts, host_key, measure_elem_costs


def measure_costs(elems: int = 1 << 20, repeats: int = 5, thc_config=None,
                  stack: bool = True, log=None) -> HostCosts:
    """The per-element costs (costs.measure_elem_costs; a few seconds), then, with `stack` and
    BytePS installed, the calibration clusters' STACK_KEYS (about two minutes on a 2-core host;
    `log` gets a line per calibration run)."""
    costs = measure_elem_costs(elems, repeats, thc_config)
    if not stack:
        return costs
    why = calibrate.available()
    if why is None:
        try:
            costs.per_elem.update(calibrate.calibrate(costs, log=log))
            costs.source += "; stack: calibration clusters (bpslaunch --local 2, loopback)"
            return costs
        except (RuntimeError, OSError) as e:
            why = f"{type(e).__name__}: {e}"[:200]
    costs.source += f"; stack: loopback TCP only ({why})"
    return costs


def _log(msg: str) -> None:  # progress on stderr: the first call on a host takes minutes
    print(f"byteps_thc.advisor: {msg}", file=sys.stderr, flush=True)


def host_costs(cache_path: Optional[str] = COST_CACHE, refresh: bool = False) -> HostCosts:
    """The costs of this host: from the cache when it was measured on the same kind of CPU."""
    key = host_key()
    if cache_path and not refresh:
        try:
            with open(cache_path) as f:
                data = json.load(f)
            if data.get("host") == key and set(COST_KEYS) <= set(data["per_elem"]):
                return HostCosts(data["per_elem"], data.get("source", "cache") + " (cached)")
        except (OSError, ValueError, KeyError):
            pass
    _log("measuring this host's costs once (per-element timings, then calibration clusters of "
         f"the real stack: about 2-4 minutes); cached in {cache_path or 'nothing'}")
    costs = measure_costs(log=_log)
    if cache_path and "reference" not in costs.source:  # never cache a stand-in for the codec
        try:
            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
            with open(cache_path, "w") as f:
                json.dump({"host": key, "per_elem": costs.per_elem, "source": costs.source}, f,
                          indent=1)
        except OSError:
            pass
    return costs
