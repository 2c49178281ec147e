"""Benchmarks and their tooling: not part of the byteps_thc library, which never imports them.

Each bench_*.py runs as a script (`.venv/bin/python benchmarks/bench_codec.py --help`); the
virtual environment's .pth puts the repository root on sys.path, from which `byteps_thc` and
the harness the benchmarks share with the tests (`harness.netem`, `harness.pslite`) import.
Recorded results (JSON records, logs, plots) live in benchmarks/results/.
"""
