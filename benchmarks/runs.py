"""What the benchmarks on the emulated network share around their runs (bench_network.py,
bench_tta.py): the records' JSON files and a matrix of runs within a time budget on one network.

A record is one run's dict; a benchmark's --json file is the JSON list of its records.
"""
import argparse
import json
import time
from typing import Callable, List, Optional, Sequence

from harness.netem import CleanupOnSignal, EmulatedNetwork, cleanup_stale


def parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser from its module docstring: the first paragraph describes it, the
    third on are the epilog of --help (the second is its usage, shown as such)."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="\n\n".join(doc.split("\n\n")[2:]))


def add_matrix_arguments(ap: argparse.ArgumentParser, subnet: str) -> None:
    """The arguments of a Matrix and its network: --time-budget, --subnet (default `subnet`),
    --json, --plot, --logdir."""
    ap.add_argument("--time-budget", type=float, default=60.0,
                    help="minutes for the whole benchmark; later runs are skipped (60)")
    ap.add_argument("--subnet", default=subnet,
                    help="addresses of the namespaces (inside 198.18.0.0/15)")
    ap.add_argument("--json", metavar="PATH", help="write one record per run")
    ap.add_argument("--plot", metavar="DIR", help="write PNG plots here")
    ap.add_argument("--logdir", default=None, help="keep the processes' logs here")


def failure(r: dict, width: int = 80) -> str:
    """A failed run's table cell: its status and the start of its error."""
    return f"{r['status']}: {str(r.get('error', ''))[:width]}"


def load_records(paths: str) -> List[dict]:
    """The records of the comma-separated JSON files `paths`, merged in order (--from-json)."""
    records: List[dict] = []
    for path in paths.split(","):
        with open(path) as f:
            records += json.load(f)
    return records


def save_records(path: Optional[str], records: Sequence[dict]) -> None:
    """Rewrite `path` (None: nothing) with all of `records`."""
    if path:
        with open(path, "w") as f:
            json.dump(list(records), f, indent=1)


class Matrix:
    """A benchmark's runs on one emulated network within `minutes`, one record each.

    `add` keeps a record and rewrites `json_path` with all of them, so that an interrupted
    benchmark keeps what it measured; `prepare(records)`, when given, completes them before each
    write. A run asked for once the time is spent is skipped (`due` is False) and named at the
    end of `run`."""

    def __init__(self, json_path: Optional[str], minutes: float, log: Callable[[str], None],
                 prepare: Optional[Callable[[List[dict]], None]] = None):
        self.json_path = json_path
        self.deadline = time.monotonic() + minutes * 60
        self.log = log
        self.prepare = prepare
        self.records: List[dict] = []
        self.skipped: List[str] = []

    def due(self, label: str) -> bool:
        """False, and `label` kept as skipped, once the time is spent."""
        if time.monotonic() > self.deadline:
            self.skipped.append(label)
            return False
        return True

    def add(self, rec: dict) -> None:
        self.records.append(rec)
        self.save()

    def save(self) -> None:
        if self.prepare is not None:
            self.prepare(self.records)
        save_records(self.json_path, self.records)

    def run(self, nodes: Sequence[str], subnet: str,
            body: Callable[[EmulatedNetwork], None]) -> bool:
        """body(net) on a new network of `nodes`, the namespaces of killed runs removed first. The
        network is removed whatever happens; SIGINT, SIGTERM or SIGHUP stop body. Then the records
        are written once more (also when there are none) and the skipped runs named. True: it was
        interrupted."""
        stale = cleanup_stale()
        if stale:
            self.log(f"removed namespaces left by killed runs: {' '.join(stale)}")
        interrupted = False
        with CleanupOnSignal():
            net = EmulatedNetwork(nodes, subnet=subnet)
            try:
                net.create()
                body(net)
            except KeyboardInterrupt as e:
                interrupted = True
                self.log(f"interrupted ({e or 'SIGINT'}): cleaning up")
            finally:
                net.destroy()
                self.log("namespaces removed")
        self.save()
        if self.skipped:
            self.log(f"time budget spent: skipped {len(self.skipped)} runs: "
                     f"{', '.join(self.skipped)}")
        return interrupted
