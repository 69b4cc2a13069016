"""modelmux's Python side: Ray Serve's multiplexing API (`from modelmux import serve`) and
the replica worker the modelmux server runs user code in."""

__version__ = "0.1.0"
