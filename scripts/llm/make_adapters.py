#!/usr/bin/env python3
"""Write the LoRA test adapters for a GGUF llama base model, in PEFT and llama.cpp GGUF form.

    make_adapters.py --gguf BASE.gguf --out DIR [--bench N --bench-rank R]

For each adapter id it writes DIR/<id>/adapter_config.json + adapter_model.safetensors (what
PEFT's save_pretrained writes) and DIR/<id>/adapter.gguf (what llama.cpp's
convert_lora_to_gguf.py writes), both describing the same weight delta. Needs numpy,
safetensors and gguf only; every random draw is seeded, so the files are byte-identical run to
run.

The adapters are not trained. A ~ N(0, 1/sqrt(in)) and B is random too (PEFT starts B at zero,
which would make every adapter a no-op), scaled per module so that ||scale * B @ A||_F is
STRENGTH x ||W||_F of the base weight it adapts: strong enough that greedy decoding of a chat
prompt departs from the base model within a few tokens, weak enough that the text stays
language (0.2: on real hidden states the delta is ~0.1-0.5x the base projection's output; at
0.3 some adapters already produce gibberish, the error compounding over 30 layers). Because the scale is divided out, an engine that gets the scale wrong (alpha/r vs
rslora's alpha/sqrt(r), rank_pattern, alpha_pattern, fp16) gets visibly different logits.

PEFT side: B rows are in Hugging Face order, as PEFT saves them.
GGUF side: llama.cpp computes W x + s * B (A x) with s = user_scale * alpha / rank(tensor)
(or s = user_scale when alpha is 0), one alpha per file and no rslora or patterns. So each
lora_b is multiplied by (PEFT scale / llama.cpp scale) to make llama.cpp compute exactly the
PEFT delta, and the lora_b of q and k is row-permuted exactly like llama.cpp's converter
permutes the base attn_q / attn_k weights (for its interleaved rotary layout).
"""
import argparse
import json
import math
import os
import re

import numpy as np
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize
from safetensors.numpy import save_file

# PEFT module -> (PEFT parent module, llama.cpp tensor name)
MODULES = {
    "q_proj": ("self_attn", "attn_q"),
    "k_proj": ("self_attn", "attn_k"),
    "v_proj": ("self_attn", "attn_v"),
    "o_proj": ("self_attn", "attn_output"),
    "gate_proj": ("mlp", "ffn_gate"),
    "up_proj": ("mlp", "ffn_up"),
    "down_proj": ("mlp", "ffn_down"),
}
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
STRENGTH = 0.2  # ||delta W||_F / ||W||_F per adapted module (tuned with reference.py --check)

# The test set. `zero` has tutor's tensors but lora_alpha 0, so its PEFT scale is 0.
# Seeds were picked (out of 12, 40 for chef) so that on SmolLM2-135M-Instruct Q4_1 the chat prompt's
# greedy tokens leave the base model's within 2 tokens and every greedy step's top-1/top-2 logit
# gap is >= 0.46: an engine's small numeric differences do not flip the greedy tokens.
ADAPTERS = [
    dict(id="pirate", r=8, alpha=16, targets=["q_proj", "v_proj"], seed=7),
    dict(id="tutor", r=4, alpha=8, targets=ATTN, seed=1),
    dict(id="poet", r=16, alpha=32, targets=list(MODULES), seed=2, dtype=np.float16),
    dict(id="chef", r=64, alpha=16, rslora=True, targets=["gate_proj", "up_proj", "down_proj"], seed=16),
    dict(id="patterns", r=8, alpha=8, targets=ATTN + ["down_proj"], seed=11,
         # PEFT matches pattern keys as the regex (.*\.)?KEY$ against the module name:
         # a full name and a suffix.
         rank_pattern={"model.layers.5.self_attn.q_proj": 16},
         alpha_pattern={"layers.11.self_attn.k_proj": 32}),
    dict(id="zero", like="tutor", alpha=0),
]


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf row permutation for q/k (HF order -> GGUF order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def pattern_get(pattern, name, default):
    """PEFT's rank_pattern / alpha_pattern lookup (peft.utils.other.get_pattern_key)."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def peft_scale(spec, name):
    r = pattern_get(spec.get("rank_pattern", {}), name, spec["r"])
    alpha = pattern_get(spec.get("alpha_pattern", {}), name, spec["alpha"])
    return r, alpha, (alpha / math.sqrt(r) if spec.get("rslora") else alpha / r)


class Base:
    """Shapes, head counts and weight norms of the base model, all read from the GGUF."""

    def __init__(self, path):
        reader = GGUFReader(path)
        f = {k: v.contents() for k, v in reader.fields.items() if not k.startswith("tokenizer.")}
        self.arch = f["general.architecture"]
        self.n_layer = int(f[f"{self.arch}.block_count"])
        self.n_head = int(f[f"{self.arch}.attention.head_count"])
        self.n_head_kv = int(f.get(f"{self.arch}.attention.head_count_kv", self.n_head))
        self.tensors = {t.name: t for t in reader.tensors}
        self._norms = {}

    def shape(self, layer, module):  # (out, in), as GGUF's ne is [in, out]
        t = self.tensors[f"blk.{layer}.{MODULES[module][1]}.weight"]
        return int(t.shape[1]), int(t.shape[0])

    def norm(self, layer, module):
        key = (layer, module)
        if key not in self._norms:
            t = self.tensors[f"blk.{layer}.{MODULES[module][1]}.weight"]
            self._norms[key] = float(np.linalg.norm(dequantize(t.data, t.tensor_type)))
        return self._norms[key]


def make(base, spec):
    """-> {PEFT module name: (A, B, peft_scale, r)} with A, B in the adapter's storage dtype."""
    rng = np.random.default_rng(spec["seed"])
    out = {}
    for layer in range(base.n_layer):
        for module in spec["targets"]:
            name = f"model.layers.{layer}.{MODULES[module][0]}.{module}"
            r, _, scale = peft_scale(spec, name)
            n_out, n_in = base.shape(layer, module)
            a = rng.standard_normal((r, n_in)) / math.sqrt(n_in)
            b = rng.standard_normal((n_out, r))
            b *= STRENGTH * base.norm(layer, module) / (scale * np.linalg.norm(b @ a))
            dtype = spec.get("dtype", np.float32)
            out[name] = (a.astype(dtype), b.astype(dtype), scale, r)
    return out


def peft_config(spec):
    return {
        "alpha_pattern": spec.get("alpha_pattern", {}),
        "base_model_name_or_path": BASE_MODEL,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": spec["alpha"],
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": spec["r"],
        "rank_pattern": spec.get("rank_pattern", {}),
        "revision": None,
        "target_modules": spec["targets"],
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": bool(spec.get("rslora", False)),
    }


def write(base, spec, weights, out_dir):
    d = os.path.join(out_dir, spec["id"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "adapter_config.json"), "w") as fh:
        json.dump(peft_config(spec), fh, indent=2, sort_keys=True)
        fh.write("\n")
    tensors = {}
    for name, (a, b, _, _) in weights.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = np.ascontiguousarray(a)
        tensors[f"base_model.model.{name}.lora_B.weight"] = np.ascontiguousarray(b)
    save_file(tensors, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})

    # llama.cpp GGUF LoRA: one alpha for the file, PEFT scale folded into lora_b.
    alpha = float(spec["alpha"])
    w = GGUFWriter(os.path.join(d, "adapter.gguf"), arch=base.arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for name, (a, b, scale, r) in weights.items():
        layer, module = re.fullmatch(r"model\.layers\.(\d+)\.\w+\.(\w+)", name).groups()
        llama_scale = alpha / r if alpha else 1.0  # llama.cpp treats alpha 0 as "no scaling"
        b = b.astype(np.float32) * np.float32(scale / llama_scale)
        if module == "q_proj":
            b = permute(b, base.n_head)
        elif module == "k_proj":
            b = permute(b, base.n_head_kv)
        prefix = f"blk.{layer}.{MODULES[module][1]}.weight"
        w.add_tensor(prefix + ".lora_a", np.ascontiguousarray(a.astype(np.float32)))
        w.add_tensor(prefix + ".lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="base model GGUF (llama architecture)")
    ap.add_argument("--out", required=True, help="output directory, one subdirectory per adapter")
    ap.add_argument("--bench", type=int, default=0, help="also write N adapters bench-00, bench-01, ...")
    ap.add_argument("--bench-rank", type=int, default=16, help="rank of the bench adapters (q,k,v,o)")
    args = ap.parse_args()

    base = Base(args.gguf)
    specs = list(ADAPTERS) + [
        dict(id=f"bench-{i:02d}", r=args.bench_rank, alpha=2 * args.bench_rank, targets=ATTN, seed=1000 + i)
        for i in range(args.bench)
    ]
    made = {}
    print(f"{'id':<10} {'r':>3} {'alpha':>5} {'rslora':>6}  {'scale':>8}  targets")
    for spec in specs:
        if "like" in spec:  # same tensors as another adapter, other config
            spec = {**next(s for s in specs if s["id"] == spec["like"]), **spec}
            made[spec["id"]] = {n: (a, b, peft_scale(spec, n)[2], r) for n, (a, b, _, r) in made[spec["like"]].items()}
        else:
            made[spec["id"]] = make(base, spec)
        write(base, spec, made[spec["id"]], args.out)
        scales = sorted({round(s, 6) for (_, _, s, _) in made[spec["id"]].values()})
        extra = "".join(f" {k}={spec[k]}" for k in ("rank_pattern", "alpha_pattern") if k in spec)
        print(f"{spec['id']:<10} {spec['r']:>3} {spec['alpha']:>5} {str(bool(spec.get('rslora'))):>6}  "
              f"{'/'.join(map(str, scales)):>8}  {','.join(spec['targets'])}{extra}")
    print(f"wrote {len(specs)} adapters to {args.out}")


if __name__ == "__main__":
    main()
