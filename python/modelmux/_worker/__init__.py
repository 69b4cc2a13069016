"""The replica worker: `python -m modelmux._worker --spec '<json>'` (see
docs/python-worker-protocol.md)."""
