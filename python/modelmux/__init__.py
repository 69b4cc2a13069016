"""modelmux's Python side: Ray Serve's multiplexing API (`from modelmux import serve`) and
the replica worker the modelmux server runs user code in."""

from modelmux._version import version as _version

__version__ = _version()
