"""`make demo`: train the digits example on a local BytePS cluster with THC and uncompressed.

Runs `bpslaunch --local 2 --servers 1` twice (THC, then none) on
example/pytorch/train_digits.py and prints the accuracy of each, the bytes that crossed the
loopback interface per training step (measured from /proc/net/dev by the training script around
its training loop: every push and pull of both workers, TCP/IP headers included), and their ratio.

Each cluster runs in its own network namespace (`unshare -n`, root only) so that nothing else on
the machine adds to the loopback counters; without one the figures may include other traffic and
the script says so.

    python scripts/demo.py [--epochs N] [--workers N] [--thc-bits B] [--keep-logs DIR]
"""
import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "example", "pytorch", "train_digits.py")
# ps-lite/BytePS start-up chatter, hidden unless --verbose (everything is shown on a failure)
NOISE = re.compile(r"Creating Van|Start ZMQ recv thread|server engine uses|has been shutdown|"
                   r"^\[scheduler\] \[|^\[server \d+\] \[(?!.*(?:rror|atal|heck failed))")


def have_byteps():
    """The fork's server and torch plugin libraries are installed (found, not imported:
    importing byteps.server would start a server)."""
    spec = importlib.util.find_spec("byteps")
    if spec is None or not spec.submodule_search_locations:
        return False
    pkg = list(spec.submodule_search_locations)[0]
    return all(any(f.startswith("c_lib") and f.endswith(".so")
                   for f in (os.listdir(os.path.join(pkg, sub))
                             if os.path.isdir(os.path.join(pkg, sub)) else []))
               for sub in ("server", "torch"))


def netns_prefix():
    """`unshare -n` + loopback up, when this machine lets us; else None."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe = subprocess.run(["unshare", "-n", "--", "ip", "link", "set", "lo", "up"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        return None
    return ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "netns"]


def run_cluster(compressor, args, stats_path, isolate):
    cmd = [sys.executable, "-m", "byteps_thc.launch", "--local", str(args.workers),
           "--servers", "1", "--compressor", compressor, "--timeout", str(args.timeout)]
    if compressor == "thc":
        cmd += ["--thc-bits", str(args.thc_bits)]
    cmd += ["--", sys.executable, EXAMPLE, "--epochs", str(args.epochs),
            "--stats-json", stats_path]
    if isolate:
        cmd = isolate + cmd
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    print(f"\n=== {compressor}: {' '.join(cmd[cmd.index('-m'):])}", flush=True)
    t0 = time.monotonic()
    lines = []
    with subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            lines.append(line)
            if args.verbose or not NOISE.search(line):
                print(line, end="", flush=True)
        code = proc.wait()
    took = time.monotonic() - t0
    if code != 0:
        if not args.verbose:
            print("".join(lines[-80:]), end="")
        raise SystemExit(f"demo: the {compressor} cluster failed (exit {code}); see above")
    with open(stats_path) as f:
        stats = json.load(f)
    stats["wall_seconds"] = took
    return stats


def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--thc-bits", type=int, default=4)
    p.add_argument("--timeout", type=float, default=900, help="seconds per cluster")
    p.add_argument("--json", metavar="PATH", help="also write the comparison here")
    p.add_argument("--verbose", action="store_true", help="show every line the processes print")
    args = p.parse_args(argv)

    if not have_byteps():
        # Until the fork is built here (`make byteps`), show the codec alone.
        print("demo: the BytePS fork is not installed in this Python (`make byteps`); showing the "
              "THC codec in one process instead (example/codec_demo.py)", flush=True)
        return subprocess.call([sys.executable, os.path.join(ROOT, "example", "codec_demo.py")],
                               cwd=ROOT)
    isolate = netns_prefix()
    if isolate is None:
        print("demo: no private network namespace (needs root, unshare and ip): loopback figures "
              "may include other traffic on this machine", flush=True)
    tmp = tempfile.mkdtemp(prefix="thc-demo-")
    try:
        results = {}
        for comp in ("thc", "none"):
            results[comp] = run_cluster(comp, args, os.path.join(tmp, f"{comp}.json"), isolate)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    thc, none = results["thc"], results["none"]
    ratio = (thc["bytes_per_step"] / none["bytes_per_step"]
             if thc.get("bytes_per_step") and none.get("bytes_per_step") else None)
    model_bytes = none["param_bytes"]
    print("\n" + "=" * 78)
    print(f"digits MLP ({model_bytes / 4:.0f} float32 parameters, {fmt_bytes(model_bytes)}), "
          f"{args.workers} workers + 1 server, {args.epochs} epochs, {none['steps']} steps")
    print(f"{'':14s}{'test accuracy':>15s}{'bytes on the wire / step':>28s}{'seconds':>10s}")
    for name, r in ((f"THC (b={args.thc_bits})", thc), ("uncompressed", none)):
        bps_ = fmt_bytes(r["bytes_per_step"]) if r.get("bytes_per_step") is not None else "n/a"
        print(f"{name:14s}{r['accuracy']:>15.4f}{bps_:>28s}{r['seconds']:>10.1f}")
    if ratio is not None:
        print(f"THC / uncompressed bytes per step: {ratio:.3f}   "
              f"accuracy difference: {100 * (thc['accuracy'] - none['accuracy']):+.2f} points")
    print("(bytes: loopback TX counted around the training loop, all pushes and pulls of all "
          f"workers, headers included{'' if isolate else '; NOT isolated'})")
    print("=" * 78)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"thc": thc, "none": none, "ratio": ratio, "isolated": bool(isolate)}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
