"""Writes the demo's customer models: `models/customer-<n>/weights.npy` for n = 1..8, random
softmax classifiers (5 x 3 float64: a 4 x 3 matrix and a bias row), the same on every run.

    python examples/python/make_models.py [--out DIR]
"""

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "models")
    args = parser.parse_args()
    for n in range(1, 9):
        rng = np.random.default_rng(n)
        weights = rng.normal(0.0, 1.5, size=(5, 3))
        directory = args.out / f"customer-{n}"
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / "weights.npy", weights)


if __name__ == "__main__":
    main()
