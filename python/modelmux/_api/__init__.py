"""The implementation behind `modelmux.serve` (Ray Serve's API on modelmux)."""
