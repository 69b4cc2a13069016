#!/usr/bin/env python3
"""Independent numpy reference forward pass for a GGUF llama model, with merged PEFT LoRA adapters.

    reference.py --gguf BASE.gguf --adapters DIR --out FILE.json [--check]
    reference.py --gguf MODEL.gguf --prompt-ids 1,2,3 [--llama3 FACTOR,LOW,HIGH,ORIGINAL]
                 [--adapter DIR] --out FILE.json

It is written the way Hugging Face's LlamaForCausalLM computes, not the way llama.cpp does, so
that it checks an engine rather than sharing its assumptions:

* Every tensor is dequantized to float32 with gguf.quants.dequantize; all math is float32.
* llama.cpp's converter permutes the rows of attn_q / attn_k (per head: HF's two rotary halves
  are interleaved) for its interleaved rotary. We undo that permutation and use HF's NeoX-style
  rotary (rotate_half, cos/sin over head_dim, inv_freq = base^(-2i/d)) on HF-ordered rows.
* Adapters are MERGED into the weights, W_hf + scale * B @ A, from the PEFT files (HF row order,
  scale from lora_alpha / r or / sqrt(r) with use_rslora, rank_pattern and alpha_pattern), so
  the result does not depend on how an engine permutes or applies LoRA at run time.
* RMSNorm, SiLU-gated MLP, grouped-query causal attention, LM head = output.weight or the tied
  token_embd.weight; greedy decoding with a KV cache (rotated keys, as HF's past_key_values).

Families: llama (q/k rows un-permuted, as above), qwen2 (q/k/v biases added after the projections)
qwen3 (RMSNorm over each q and k head, weights attn_q_norm / attn_k_norm, before the rotary)
and phi3 (fused attn_qkv and gate/up ffn_up tensors, split as Hugging Face's Phi3 splits them),
all with rows in Hugging Face's order as llama.cpp's converter leaves them; a head size from
{arch}.attention.key_length. mistral3 is computed as llama, with YaRN (HF's rope_type "yarn") and
Ministral 3's llama_4_scaling_beta query scaling from the GGUF's rope.scaling.* and
attention.temperature_scale keys.

gemma2 and gemma3 as Hugging Face's Gemma2ForCausalLM / Gemma3ForCausalLM compute (the config
fields read from the GGUF keys llama.cpp's converter writes them to):
* Gemma's RMSNorm multiplies by (1 + weight); the converter stores weight + 1, so the reference
  subtracts 1 at load and adds it back in the norm, as HF writes it.
* embeddings times sqrt(hidden_size); GELU (tanh form) gating; post_attention_layernorm on the
  attention output and pre/post_feedforward_layernorm around the MLP (GGUF ffn_norm and
  post_ffw_norm); scores scaled by query_pre_attn_scalar^-0.5 (head_dim: the GGUF does not carry
  it; --query-pre-attn-scalar overrides), then attn_logit_softcapping (gemma2); logits through
  final_logit_softcapping.
* sliding layers: gemma2 `not layer_idx % 2`; gemma3 `(layer_idx + 1) % sliding_window_pattern`
  (6, or the GGUF's sliding_window_pattern); a query at i sees keys j with i - j < sliding_window.
* gemma3 rotary: sliding layers rope_local_base_freq (rope.freq_base_swa, default 10000),
  unscaled; full-attention layers rope_theta with linear rope_scaling (inv_freq / factor).
  gemma2: one rotary for all layers (with the linear factor when given).
* gemma3 q_norm / k_norm: Gemma's (1 + weight) RMSNorm over each head, before the rotary.

Writes {"gguf", "cases": [{"name", "adapter", "prompt_ids", "last_logits", "greedy",
"greedy_margins", "embedding"}]}: the logits at the last prompt position, the prompt's embedding
(mean of the final-normed last hidden states, unit length), 8 greedy tokens and, per greedy step,
the top-1 minus top-2 logit (how robust that token is), for 3 prompts on the base model and for
the chat prompt with each test adapter. --check prints, per adapter, base vs adapter greedy tokens.
The second form writes {"last_logits"} for one prompt; with --llama3, the rotary frequencies
are Llama 3's `rope_scaling` (rope_type "llama3": factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings) computed as Hugging Face's _compute_llama3_parameters
defines them, from those numbers, never from a rope_freqs tensor in the file.
Importable: load_model, load_adapter, forward, greedy, run, llama3_inv_freq.
"""
import argparse
import json
import math
import os
import re
import time

# One BLAS thread: these matrices are small, and several OpenBLAS threads on a busy 2-core machine
# are ~20x slower than one. Also keeps results identical run to run.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

# Fixed prompt token ids. Made once with the `tokenizers` package from the GGUF's own vocab and
# merges (tokenizer.ggml.tokens / .merges, BPE), pre-tokenizer Sequence[Digits(individual_digits=
# True), ByteLevel(add_prefix_space=False, use_regex=True)], the 17 control tokens (token_type 3,
# <|im_start|> = 1, <|im_end|> = 2) as special tokens, and checked to decode back to the text.
PROMPTS = {
    # "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    "chat": [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    # "The sun rises in the east and sets in the west, and the moon"
    "plain": [504, 2388, 13685, 281, 260, 6251, 284, 5208, 281, 260, 5846, 28, 284, 260, 6783],
    # "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
    "code": [1604, 3987, 46477, 24, 94, 727, 472, 585, 304, 2067, 216, 34, 42, 448, 1003, 304, 472, 1003],
}
ADAPTERS = ["pirate", "tutor", "poet", "chef", "patterns", "zero"]
CASES = [(p, None) for p in PROMPTS] + [("chat", a) for a in ADAPTERS]
N_GREEDY = 8
# PEFT module -> llama.cpp tensor name
GGUF_NAME = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
             # Phi-3's fused modules, merged into its fused tensors
             "qkv_proj": "attn_qkv", "gate_up_proj": "ffn_up"}


def unpermute(w, n_head):
    """Inverse of llama.cpp's q/k row permutation: GGUF row order -> Hugging Face row order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_model(path):
    """-> (config dict, {tensor name: float32 array, q/k in HF row order}) from a GGUF llama."""
    reader = GGUFReader(path)
    f = {k: v.contents() for k, v in reader.fields.items() if not k.startswith("tokenizer.ggml.merges")}
    arch = f["general.architecture"]
    cfg = dict(
        n_layer=int(f[f"{arch}.block_count"]),
        n_embd=int(f[f"{arch}.embedding_length"]),
        n_head=int(f[f"{arch}.attention.head_count"]),
        eps=float(f[f"{arch}.attention.layer_norm_rms_epsilon"]),
        rope_base=float(f.get(f"{arch}.rope.freq_base", 10000.0)),
        tokens=f.get("tokenizer.ggml.tokens"),  # absent from the tests' weights-only copies
    )
    cfg["n_head_kv"] = int(f.get(f"{arch}.attention.head_count_kv", cfg["n_head"]))
    cfg["head_dim"] = int(f.get(f"{arch}.attention.key_length", cfg["n_embd"] // cfg["n_head"]))
    cfg["rope_dim"] = int(f.get(f"{arch}.rope.dimension_count", cfg["head_dim"]))
    cfg["arch"] = arch
    gemma = arch in ("gemma2", "gemma3")
    cfg["gemma"] = gemma
    cfg["rope_factor"] = float(f.get(f"{arch}.rope.scaling.factor", 1.0)) or 1.0
    if f.get(f"{arch}.rope.scaling.type") == "yarn":  # HF rope_type "yarn", as the converter maps it
        original = int(f.get(f"{arch}.rope.scaling.original_context_length", f[f"{arch}.context_length"]))
        cfg["yarn"] = dict(factor=cfg["rope_factor"], original_max_position_embeddings=original,
                           beta_fast=float(f.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
                           beta_slow=float(f.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
                           mscale_all_dim=f.get(f"{arch}.rope.scaling.yarn_log_multiplier"))
        if f.get(f"{arch}.attention.temperature_scale") is not None:  # Ministral 3's llama_4_scaling_beta
            cfg["llama_4_scaling_beta"] = float(f[f"{arch}.attention.temperature_scale"])
    if gemma:
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]
        cfg["attn_softcap"] = float(f.get(f"{arch}.attn_logit_softcapping", 0.0)) or None
        cfg["final_softcap"] = float(f.get(f"{arch}.final_logit_softcapping", 0.0)) or None
        window = int(f.get(f"{arch}.attention.sliding_window", 0))
        cfg["sliding_window"] = window or None
        n = cfg["n_layer"]
        if not window:
            sliding = [False] * n
        elif arch == "gemma2":
            sliding = [not bool(i % 2) for i in range(n)]
        else:
            pattern = int(f.get(f"{arch}.attention.sliding_window_pattern", 6))
            sliding = [bool((i + 1) % pattern) for i in range(n)]
        cfg["sliding"] = sliding
        local_base = float(f.get(f"{arch}.rope.freq_base_swa", 10000.0 if arch == "gemma3" else cfg["rope_base"]))
        cfg["rope_local_base"] = local_base
    w = {}
    # llama.cpp permutes q/k rows only for the families it runs with interleaved rotary pairs;
    # Qwen's stay in Hugging Face's order (llama.cpp runs them with NeoX rotary).
    permuted = arch in ("llama", "mistral3")
    for t in reader.tensors:
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if permuted and t.name.endswith("attn_q.weight"):
            a = unpermute(a, cfg["n_head"])
        elif permuted and t.name.endswith("attn_k.weight"):
            a = unpermute(a, cfg["n_head_kv"])
        if gemma and t.name.endswith("norm.weight"):
            a = a - np.float32(1.0)  # the converter's + 1 undone: HF's weight
        w[t.name] = np.ascontiguousarray(a)
    w.setdefault("output.weight", w["token_embd.weight"])  # tied embeddings
    return cfg, w


def pattern_get(pattern, name, default):
    """PEFT's rank_pattern / alpha_pattern lookup: key matched as (.*\\.)?KEY$ on the module name."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def load_adapter(adapter_dir, weights):
    """-> a copy of `weights` with the PEFT adapter merged: W + scale * B @ A (float32, HF order)."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as fh:
        c = json.load(fh)
    assert c["peft_type"] == "LORA" and not c.get("use_dora") and not c.get("fan_in_fan_out")
    t = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    merged = dict(weights)
    for key in sorted(k for k in t if k.endswith(".lora_A.weight")):
        name = key[len("base_model.model."):-len(".lora_A.weight")]  # model.layers.3.self_attn.q_proj
        a = t[key].astype(np.float32)
        b = t[key.replace("lora_A", "lora_B")].astype(np.float32)
        r = pattern_get(c.get("rank_pattern") or {}, name, c["r"])
        alpha = pattern_get(c.get("alpha_pattern") or {}, name, c["lora_alpha"])
        assert a.shape[0] == r == b.shape[1], (name, a.shape, b.shape, r)
        scale = alpha / math.sqrt(r) if c.get("use_rslora") else alpha / r
        layer, module = re.fullmatch(r"model\.layers\.(\d+)\.\w+\.(\w+)", name).groups()
        gname = f"blk.{layer}.{GGUF_NAME[module]}.weight"
        merged[gname] = weights[gname] + np.float32(scale) * (b @ a)
    return merged


def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def gemma_rms_norm(x, w, eps):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), weight as Hugging Face stores it."""
    return (np.float32(1.0) + w) * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def norm(cfg, x, w):
    return gemma_rms_norm(x, w, cfg["eps"]) if cfg.get("gemma") else rms_norm(x, w, cfg["eps"])


def gelu_tanh(x):
    """Hugging Face's gelu_pytorch_tanh."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x ** 3)))


def soft_cap(x, cap):
    return x if cap is None else np.tanh(x / np.float32(cap)) * np.float32(cap)


def head(cfg, w, x):
    """Final norm, LM head and (Gemma 2) final soft-capping of hidden states x."""
    logits = norm(cfg, x, w["output_norm.weight"]) @ w["output.weight"].T
    return soft_cap(logits, cfg.get("final_softcap")).astype(np.float32)


def forward(cfg, w, ids, cache=None):
    """Logits (float32, [vocab]) at the last position of `ids`.

    With `cache` (a list, as HF's past_key_values: per layer the rotated keys and the values of
    the positions so far, filled in here), `ids` continue the cached sequence."""
    x = hidden_states(cfg, w, ids, cache)
    return head(cfg, w, x[-1])


def embedding(cfg, w, ids):
    """Mean over the positions of the last hidden states after the final norm, scaled to
    length 1 (float64 for the mean and the norm)."""
    h = norm(cfg, hidden_states(cfg, w, list(ids)), w["output_norm.weight"]).astype(np.float64)
    m = h.mean(axis=0)
    return (m / np.linalg.norm(m)).astype(np.float32)


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, original):
    """Llama 3's scaled rotary frequencies (Hugging Face's rope_type "llama3"): wavelengths
    shorter than original / high_freq_factor keep their frequency, longer than
    original / low_freq_factor are divided by factor, and those between are interpolated."""
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    low_wavelen, high_wavelen = original / low_freq_factor, original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def yarn_inv_freq(base, dim, factor, original_max_position_embeddings, beta_fast, beta_slow, mscale_all_dim):
    """Hugging Face's _compute_yarn_parameters (mscale = 1; mscale_all_dim from the GGUF's
    yarn_log_multiplier): -> (inv_freq, attention_factor)."""
    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    if mscale_all_dim:
        attention_factor = get_mscale(factor, 1.0) / get_mscale(factor, mscale_all_dim)
    else:
        attention_factor = get_mscale(factor)

    def correction_dim(rotations):
        return (dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # inv_freq_extrapolation_factor
    return (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32), attention_factor


def hidden_states(cfg, w, ids, cache=None):
    """The residual stream after the last block ([T, d], float32), before the final norm."""
    T, nh, nkv, hd = len(ids), cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    rd, start = cfg["rope_dim"], (cache[0][0].shape[1] if cache else 0)

    def rotary(base, factor, yarn=None):  # HF's default rotary; linear rope_scaling's inv_freq / factor
        inv_freq = cfg.get("inv_freq")
        if inv_freq is None:
            inv_freq = 1.0 / (base ** (np.arange(0, rd, 2, dtype=np.float32) / rd))
        attention_factor = 1.0
        if yarn:
            inv_freq, attention_factor = yarn_inv_freq(base, rd, **yarn)
        else:
            inv_freq = inv_freq / np.float32(factor)
        freqs = np.outer(np.arange(start, start + T, dtype=np.float32), inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        return ((np.cos(emb) * attention_factor).astype(np.float32),
                (np.sin(emb) * attention_factor).astype(np.float32))

    global_rotary = rotary(cfg["rope_base"], cfg["rope_factor"], cfg.get("yarn"))
    if cfg["arch"] == "gemma3":  # local layers: their own base, no scaling
        local_rotary = rotary(cfg["rope_local_base"], 1.0)
    elif cfg["arch"] == "gemma2":
        local_rotary = rotary(cfg["rope_local_base"], cfg["rope_factor"])
    else:
        local_rotary = global_rotary

    def rope(x, cos, sin):  # x: [heads, T, hd]; HF rotary on the first rope_dim dims
        xr = x[..., :rd] * cos + rotate_half(x[..., :rd]) * sin
        return np.concatenate([xr, x[..., rd:]], axis=-1)

    mask = np.triu(np.full((T, start + T), -np.inf, dtype=np.float32), k=start + 1)  # causal
    window_mask = mask
    if cfg.get("sliding_window"):  # query at start + a sees key b when start + a - b < window
        rows, cols = np.arange(start, start + T)[:, None], np.arange(start + T)[None, :]
        window_mask = np.where(rows - cols >= cfg["sliding_window"], np.float32(-np.inf), mask)
    x = w["token_embd.weight"][np.asarray(ids)]
    if cfg.get("gemma"):
        x = x * np.float32(math.sqrt(cfg["n_embd"]))
    scale = np.float32(cfg.get("query_pre_attn_scalar", hd) ** -0.5)
    for i in range(cfg["n_layer"]):
        p = f"blk.{i}."
        sliding = cfg.get("sliding", [False] * cfg["n_layer"])[i]
        cos, sin = local_rotary if sliding else global_rotary
        h = norm(cfg, x, w[p + "attn_norm.weight"])

        if p + "attn_qkv.weight" in w:  # Phi-3's fused projection: q, k and v rows stacked
            fused = np.split(h @ w[p + "attn_qkv.weight"].T, [nh * hd, (nh + nkv) * hd], axis=-1)
            linear = dict(zip(("attn_q", "attn_k", "attn_v"), fused, strict=True))
        else:
            linear = {n: h @ w[p + n + ".weight"].T for n in ("attn_q", "attn_k", "attn_v")}

        def proj(name, heads, linear=linear, p=p):  # Qwen2's biases; Qwen3's RMSNorm of each q and k head
            y = linear[name] + w.get(p + name + ".bias", np.float32(0))
            y = y.reshape(T, heads, hd)
            if p + name + "_norm.weight" in w:
                y = norm(cfg, y, w[p + name + "_norm.weight"])
            return y.transpose(1, 0, 2)

        q, k = rope(proj("attn_q", nh), cos, sin), rope(proj("attn_k", nkv), cos, sin)
        v = proj("attn_v", nkv)
        if "llama_4_scaling_beta" in cfg:  # Ministral 3: 1 + beta * log(1 + floor(pos / original))
            positions = np.arange(start, start + T, dtype=np.float64)
            original = cfg["yarn"]["original_max_position_embeddings"]
            q = q * (1 + cfg["llama_4_scaling_beta"] * np.log(1 + np.floor(positions / original)))[None, :, None].astype(np.float32)
        if cache is not None:
            if i < len(cache):
                k, v = np.concatenate([cache[i][0], k], axis=1), np.concatenate([cache[i][1], v], axis=1)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)  # HF repeat_kv
        s = soft_cap(q @ k.transpose(0, 2, 1) * scale, cfg.get("attn_softcap"))
        s = s + (window_mask if sliding else mask)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(T, nh * hd) @ w[p + "attn_output.weight"].T
        if cfg.get("gemma"):
            o = norm(cfg, o, w[p + "post_attention_norm.weight"])
        x = x + o
        h = norm(cfg, x, w[p + "ffn_norm.weight"])
        if p + "ffn_gate.weight" in w:
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        else:  # Phi-3's fused gate_up_proj: the gate's rows, then up's (HF's chunk(2))
            g, u = np.split(h @ w[p + "ffn_up.weight"].T, 2, axis=-1)
        act = gelu_tanh(g) if cfg.get("gemma") else g / (1.0 + np.exp(-g))
        m = (act * u) @ w[p + "ffn_down.weight"].T
        if cfg.get("gemma"):
            m = norm(cfg, m, w[p + "post_ffw_norm.weight"])
        x = x + m
    return x


def greedy(cfg, w, ids, n=N_GREEDY):
    """-> (logits at the last prompt position, n greedy ids, each step's top-1 minus top-2 logit).

    Uses a KV cache; does not stop at end-of-turn tokens."""
    cache, out, margins = [], [], []
    first = logits = forward(cfg, w, list(ids), cache)
    while True:
        top2 = np.partition(logits, -2)[-2:]
        out.append(int(np.argmax(logits)))
        margins.append(round(float(top2[1] - top2[0]), 4))
        if len(out) == n:
            return first, out, margins
        logits = forward(cfg, w, out[-1:], cache)


_BYTE = {}


def decode(cfg, ids):
    """GPT-2 byte-level decoding of token ids with the GGUF vocab (for humans only)."""
    if not _BYTE:  # inverse of GPT-2's bytes_to_unicode
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs, n = list(bs), 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE.update({chr(c): b for b, c in zip(bs, cs, strict=True)})
    text = "".join(cfg["tokens"][i] for i in ids)
    return bytes(_BYTE.get(ch, ord("?")) for ch in text).decode("utf-8", errors="replace")


def run(gguf, adapters_dir, log=print):
    """Compute every case; -> (cfg, list of case dicts)."""
    t0 = time.perf_counter()
    cfg, base = load_model(gguf)
    log(f"loaded + dequantized {gguf} in {time.perf_counter() - t0:.1f}s")
    cases = []
    for prompt, adapter in CASES:
        t1 = time.perf_counter()
        w = base if adapter is None else load_adapter(os.path.join(adapters_dir, adapter), base)
        logits, toks, margins = greedy(cfg, w, PROMPTS[prompt])
        assert np.all(np.isfinite(logits)), (prompt, adapter)
        name = prompt if adapter is None else f"{prompt}+{adapter}"
        emb = embedding(cfg, w, PROMPTS[prompt])
        cases.append(dict(name=name, adapter=adapter, prompt_ids=PROMPTS[prompt],
                          last_logits=logits, greedy=toks, greedy_margins=margins, embedding=emb))
        log(f"  {name:<14} {time.perf_counter() - t1:4.1f}s  {toks}  {decode(cfg, toks)!r}  min margin {min(margins)}")
    log(f"total {time.perf_counter() - t0:.1f}s")
    return cfg, cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--adapters", help="directory written by make_adapters.py")
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--check", action="store_true", help="print base vs adapter greedy tokens")
    ap.add_argument("--prompt-ids", help="one prompt's ids, comma-separated: write its last logits")
    ap.add_argument("--llama3", help="FACTOR,LOW,HIGH,ORIGINAL: Llama 3 rope scaling")
    ap.add_argument("--adapter", help="with --prompt-ids: a PEFT adapter directory to merge")
    ap.add_argument("--query-pre-attn-scalar", type=float,
                    help="Gemma's query_pre_attn_scalar (default: the head size)")
    ap.add_argument("--prompt-logprobs", type=int, metavar="K",
                    help="with --prompt-ids: also write each prompt token's log probability given "
                         "the tokens before it, and the K most likely tokens there (log-softmax in f64)")
    args = ap.parse_args()
    if args.prompt_ids:
        cfg, w = load_model(args.gguf)
        w.pop("rope_freqs.weight", None)  # the definition below, not the file's factors
        if args.llama3:
            factor, low, high, original = (float(x) for x in args.llama3.split(","))
            cfg["inv_freq"] = llama3_inv_freq(cfg["rope_base"], cfg["rope_dim"], factor, low, high, original)
        if args.query_pre_attn_scalar:
            cfg["query_pre_attn_scalar"] = args.query_pre_attn_scalar
        if args.adapter:
            w = load_adapter(args.adapter, w)
        ids = [int(x) for x in args.prompt_ids.split(",")]
        logits = forward(cfg, w, ids)
        doc = {"last_logits": [float(f"{v:.7g}") for v in logits.tolist()]}
        if args.prompt_logprobs is not None:
            x = hidden_states(cfg, w, ids)
            every = head(cfg, w, x).astype(np.float64)
            every = every - every.max(axis=-1, keepdims=True)
            logp = every - np.log(np.exp(every).sum(axis=-1, keepdims=True))
            doc["prompt_logprobs"] = [
                {"token": ids[t], "logprob": float(logp[t - 1, ids[t]]),
                 "top": [[int(i), float(logp[t - 1, i])] for i in np.argsort(-logp[t - 1], kind="stable")[:args.prompt_logprobs]]}
                for t in range(1, len(ids))]
        with open(args.out, "w") as fh:
            json.dump(doc, fh)
        return
    if not args.adapters:
        ap.error("--adapters is required")
    cfg, cases = run(args.gguf, args.adapters)
    if args.out:
        doc = {"gguf": args.gguf, "cases": [
            {**c, "last_logits": [float(f"{v:.6g}") for v in c["last_logits"].tolist()],
             "embedding": [float(f"{v:.7g}") for v in c["embedding"].tolist()]} for c in cases]}
        with open(args.out, "w") as fh:
            json.dump(doc, fh, separators=(",", ":"))
            fh.write("\n")
        print(f"wrote {args.out}")
    if args.check:
        base = next(c for c in cases if c["name"] == "chat")
        print(f"base     {base['greedy']} {decode(cfg, base['greedy'])!r}")
        ok = True
        for c in cases:
            if c["adapter"] is None:
                continue
            diff = next((i for i, (x, y) in enumerate(zip(base["greedy"], c["greedy"], strict=False)) if x != y), None)
            want_same = c["adapter"] == "zero"
            good = (diff is None) if want_same else (diff is not None)
            ok &= good
            verdict = "same as base" if diff is None else f"differs from token {diff}"
            print(f"{c['adapter']:<8} {c['greedy']} {verdict} [{'ok' if good else 'UNEXPECTED'}]")
        raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
