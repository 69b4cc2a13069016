"""`python -m modelmux._worker --spec '<json>'|- [--inspect]` (`-`: the spec on stdin)."""

from __future__ import annotations

import argparse
import io
import json
import signal
import sys


def main() -> None:
    """Parses the command line and runs the worker or the inspection."""
    parser = argparse.ArgumentParser(prog="python -m modelmux._worker")
    parser.add_argument(
        "--spec", required=True, help="the worker's spec, a JSON object ('-': read it from stdin)"
    )
    parser.add_argument("--inspect", action="store_true", help="describe the application")
    args = parser.parse_args()
    try:
        # The server sends it on stdin: a command line is visible to every account (`ps`),
        # and the spec holds the deployment's user_config.
        text = sys.stdin.buffer.read().decode("utf-8") if args.spec == "-" else args.spec
        spec = json.loads(text)
        if not isinstance(spec, dict):
            raise ValueError("the spec must be a JSON object")
    except ValueError as e:
        message = f"bad --spec: {e}"
        if args.inspect:
            print(json.dumps({"ok": False, "error": f"<spec>:0: ValueError: {message}"}))
            sys.exit(2)
        print(f"modelmux worker: {message}", file=sys.stderr)
        sys.exit(1)
    if args.inspect:
        from modelmux._worker import inspect

        sys.exit(inspect.run(spec))
    # The server ends workers by closing their socket; Ctrl-C in its terminal is for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(spec.get("parent_pid"))
    # The server logs the worker's output line by line, as it comes.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    from modelmux._worker import worker

    worker.run(spec)


def _die_with(parent_pid: object) -> None:
    """Has the kernel kill this worker when the server that started it exits, however it
    exits: a worker stuck in user code never reads the socket's end, and must not outlive a
    server that was killed (Linux only; elsewhere the closed socket ends it). The signal
    follows the thread that started the worker: the server starts workers from its runtime's
    threads, which live as long as it does."""
    if not sys.platform.startswith("linux") or not isinstance(parent_pid, int):
        return
    import ctypes
    import os

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the server was gone before the kernel was told
        os._exit(1)


if __name__ == "__main__":
    main()
