"""Tests of modelmux's Python side (run: python -m unittest discover -s python/tests -t python)."""
