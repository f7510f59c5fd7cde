"""``spyglass bench startup``: seconds from starting ``spyglass serve`` until ``/ready`` answers 200,
and how long ``spyglass --help``, ``serve --help`` and ``plugins`` take to answer.

Each run starts a fresh server process (``python -m spyglass.core.cli.main serve``, the console
script's code) on a free port, polls ``/ready`` every 10 ms, then stops it with SIGTERM. The first
run may convert the model and compile the kernels; the later ones are second starts (weights
memory-mapped from the cache), whose median is the figure. Options after ``--`` go to ``serve``.
"""

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

_POLL_SECONDS = 0.01
_QUICK_COMMANDS = (["--help"], ["serve", "--help"], ["plugins"])


def add_parser(subparsers, argv) -> None:
    """Register ``bench startup``."""
    parser = subparsers.add_parser(
        "startup", help="seconds from starting spyglass serve until /ready answers"
    )
    parser.add_argument("--repeats", type=int, default=3, help="second starts to time")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait per start")
    parser.add_argument(
        "serve_args", nargs=argparse.REMAINDER, help="options for spyglass serve, after --"
    )
    parser.set_defaults(run=run)


def _spyglass(*argv: str) -> list[str]:
    """The command line of ``spyglass ARGV`` in a fresh interpreter (the console script's code)."""
    return [sys.executable, "-m", "spyglass.core.cli.main", *argv]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def time_to_ready(serve_args: list[str], timeout: float) -> float:
    """Seconds until a new ``spyglass serve`` answers ``/ready`` with 200; the server is stopped after."""
    port = _free_port()
    command = _spyglass("serve", "--port", str(port))
    # The log goes to a file, not a pipe: nothing to drain while polling.
    with tempfile.TemporaryFile(mode="w+") as log:
        start = time.perf_counter()
        server = subprocess.Popen([*command, *serve_args], stdout=subprocess.DEVNULL, stderr=log)
        try:
            while not _ready(f"http://127.0.0.1:{port}/ready"):
                if server.poll() is not None:
                    log.seek(0)
                    tail = log.read()[-2000:]
                    raise RuntimeError(f"spyglass serve exited with {server.returncode}: {tail}")
                if time.perf_counter() - start > timeout:
                    raise TimeoutError(f"spyglass serve was not ready after {timeout:.0f} s")
                time.sleep(_POLL_SECONDS)
            return time.perf_counter() - start
        finally:
            server.terminate()
            server.wait(timeout=60)


def seconds_to_answer(argv: list[str]) -> float:
    """Seconds for ``spyglass ARGV`` (a fresh process) to exit; raises if it fails."""
    start = time.perf_counter()
    subprocess.run(
        _spyglass(*argv),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def run(args) -> int:
    """One first start, then ``--repeats`` second starts; print each and the median, then the
    answer times of the quick commands."""
    serve_args = [a for a in args.serve_args if a != "--"]
    try:
        first = time_to_ready(serve_args, args.timeout)
        seconds = [time_to_ready(serve_args, args.timeout) for _ in range(args.repeats)]
    except (RuntimeError, TimeoutError) as error:
        print(f"bench startup: {error}", file=sys.stderr)
        return 1
    print(
        f"spyglass serve until /ready: first start {first:.2f} s; second starts "
        + ", ".join(f"{s:.2f}" for s in seconds)
        + f" s: median {statistics.median(seconds):.2f} s"
    )
    quick = {" ".join(argv): seconds_to_answer(argv) for argv in _QUICK_COMMANDS}
    print("answered in: " + ", ".join(f"spyglass {name} {s:.2f} s" for name, s in quick.items()))
    return 0
