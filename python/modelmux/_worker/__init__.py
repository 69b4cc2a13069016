"""The replica worker: `python -m modelmux._worker --spec -`, the spec on stdin (see
docs/python-worker-protocol.md)."""
