"""What the tests and the benchmarks share: tooling, not part of the byteps_thc library.

- `harness.pslite`: the ps-lite test client (`thc_client.cc`, compiled against the fork build's
  ps-lite) and a real local cluster of it with the fork's scheduler and server;
- `harness.netem`: an emulated cluster network on one host (network namespaces, tbf links).

It is a top-level package of the repository, which the virtual environment puts on sys.path
(scripts/venv.sh writes its .pth) and pytest too (`pythonpath` in pyproject.toml), so that tests
and benchmarks import it alike and neither imports the other. byteps_thc never imports it.
"""
