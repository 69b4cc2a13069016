"""Prints a TCP port on 127.0.0.1 that was free a moment ago (the scripts start servers on it).

Usage: python3 scripts/lib/free_port.py"""

from benchutil import free_port

if __name__ == "__main__":
    print(free_port())
