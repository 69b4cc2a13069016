"""scripts/llm/device-bundle's Python.

  device_bundle.py test-executables < cargo's --message-format=json
      each test binary cargo built: its target's name and path, one a line
  device_bundle.py gguf-data-offset GGUF
      the byte offset of a GGUF's tensor data (its header, tokenizer included, comes before;
      needs gguf)"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator


def test_executables(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    for line in lines:
        d = json.loads(line)
        if d.get("reason") == "compiler-artifact" and d.get("executable") and d["profile"]["test"]:
            yield d["target"]["name"], d["executable"]


def main(argv: list[str]) -> int:
    if argv == ["test-executables"]:
        for name, path in test_executables(sys.stdin):
            print(name, path)
    elif argv[:1] == ["gguf-data-offset"] and len(argv) == 2:
        from gguf import GGUFReader

        print(GGUFReader(argv[1]).data_offset)
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
