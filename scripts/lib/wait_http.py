"""Waits until a server answers HTTP at URL (any status), while its process PID runs: exits 1
naming why when the process exits first or TIMEOUT seconds (default 60) pass.

Usage: python3 scripts/lib/wait_http.py URL PID [TIMEOUT] [NAME]"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    url, pid = argv[0], int(argv[1])
    timeout = float(argv[2]) if len(argv) > 2 else 60.0
    name = argv[3] if len(argv) > 3 else "the server"
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return 0
        except urllib.error.HTTPError:
            return 0  # it answered
        except Exception as e:
            try:
                os.kill(pid, 0)
            except OSError:
                sys.exit(f"{name} exited before answering at {url}")
            if time.time() > deadline:
                sys.exit(f"{name} at {url} did not start within {timeout:.0f} s: {e}")
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
