"""Benchmarks and their tooling: not part of the byteps_thc library, which never imports them.

Each bench_*.py runs as a script (`python benchmarks/bench_codec.py --help`) and puts the
repository root on sys.path, so that `byteps_thc` and `benchmarks.netem` import from this
checkout. Recorded results (JSON records, logs, plots) live in benchmarks/results/.
"""
