"""scripts/llm/quantized-spread's perturbation: every adapter's weights under DIR multiplied by
(1 + 1e-6 x standard normal noise), drawn from SEED (needs numpy and safetensors).

Usage: PYTHON scripts/lib/quantized_spread.py SEED ADAPTERS_DIR"""

from __future__ import annotations

import os
import sys

RELATIVE_NOISE = 1e-6


def perturb(seed: int, adapters: str) -> None:
    import numpy as np
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    for name in sorted(os.listdir(adapters)):
        path = os.path.join(adapters, name, "adapter_model.safetensors")
        tensors = {k: (v * (1 + RELATIVE_NOISE * rng.standard_normal(v.shape))).astype(v.dtype)
                   for k, v in load_file(path).items()}
        save_file(tensors, path, metadata={"format": "pt"})


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    perturb(int(sys.argv[1]), sys.argv[2])
