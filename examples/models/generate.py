#!/usr/bin/env python3
"""Generates the demo model repository of modelmux, and large models for benchmarks.

The demo repository: eight per-customer classifiers of the same shape with different weights,
the situation model multiplexing is for. Each is a small MLP,

    features [N, 4] float32 -> Gemm(4x16) -> Relu -> Gemm(16x3) -> Softmax -> probabilities [N, 3]

written as `<id>/model.onnx`, next to `<id>/reference.json`: a sample input and the output numpy
computes for it, independently of any ONNX runtime, so tests can check the server's answers.

    python3 examples/models/generate.py                      # rewrites examples/models/
    python3 examples/models/generate.py --out DIR             # writes them to DIR instead
    python3 examples/models/generate.py --large OUT --mb 150  # one large model for benchmarks

Needs `numpy` and `onnx` (from PyPI). The output is deterministic (fixed seeds), so running it
again changes nothing; the server itself needs no Python.
"""

import argparse
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 8
IDS = [f"customer-{i}" for i in range(1, 9)]
N_FEATURES, N_HIDDEN, N_CLASSES = 4, 16, 3


def mlp(name, layers, n_in, n_out, softmax):
    """An ONNX graph of Gemm (+Relu) layers; `layers` is a list of (weight [in, out], bias)."""
    nodes, inits = [], []
    x = "features"
    for i, (w, b) in enumerate(layers):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [out]))
        if i + 1 < len(layers):
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            out = f"r{i}"
        x = out
    final = "probabilities" if softmax else "scores"
    if softmax:
        nodes.append(helper.make_node("Softmax", [x], [final], axis=-1))
    else:
        nodes.append(helper.make_node("Identity", [x], [final]))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info(final, TensorProto.FLOAT, ["N", n_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    model.producer_name = "modelmux examples/models/generate.py"
    onnx.checker.check_model(model)
    return model


def forward(layers, x, softmax):
    """The same network in numpy (float64, then rounded to float32 as ONNX would return)."""
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(layers):
        h = h @ w.astype(np.float64) + b.astype(np.float64)
        if i + 1 < len(layers):
            h = np.maximum(h, 0.0)
    if softmax:
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        h = e / e.sum(axis=-1, keepdims=True)
    return h.astype(np.float32)


def demo(root):
    for seed, model_id in enumerate(IDS, start=1):
        rng = np.random.default_rng(seed)
        layers = [
            (rng.normal(0, 1, (N_FEATURES, N_HIDDEN)).astype(np.float32),
             rng.normal(0, 0.1, N_HIDDEN).astype(np.float32)),
            (rng.normal(0, 1, (N_HIDDEN, N_CLASSES)).astype(np.float32),
             rng.normal(0, 0.1, N_CLASSES).astype(np.float32)),
        ]
        directory = os.path.join(root, model_id)
        os.makedirs(directory, exist_ok=True)
        onnx.save(mlp(model_id, layers, N_FEATURES, N_CLASSES, True),
                  os.path.join(directory, "model.onnx"))
        x = np.random.default_rng(1000 + seed).normal(0, 1, (3, N_FEATURES)).astype(np.float32)
        reference = {
            "inputs": {"features": x.tolist()},
            "outputs": {"probabilities": forward(layers, x, True).tolist()},
        }
        with open(os.path.join(directory, "reference.json"), "w") as f:
            json.dump(reference, f, indent=1)
            f.write("\n")


def large(path, megabytes, width):
    """An MLP of width x width layers whose weights total about `megabytes` MiB."""
    per_layer = width * width * 4
    count = max(1, round(megabytes * (1 << 20) / per_layer))
    rng = np.random.default_rng(7)
    layers = [(rng.normal(0, width ** -0.5, (width, width)).astype(np.float32),
               np.zeros(width, np.float32)) for _ in range(count)]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    onnx.save(mlp("large", layers, width, width, False), path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", metavar="PATH", help="write one large model to PATH instead")
    parser.add_argument("--out", metavar="DIR", help="write the demo repository to DIR instead")
    parser.add_argument("--mb", type=float, default=150, help="size of the large model, MiB")
    parser.add_argument("--width", type=int, default=2048, help="layer width of the large model")
    args = parser.parse_args()
    if args.large:
        large(args.large, args.mb, args.width)
    else:
        demo(args.out or os.path.dirname(os.path.abspath(__file__)))


if __name__ == "__main__":
    main()
