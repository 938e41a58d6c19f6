"""Capture handlers for the ops of today's decoder models (Llama, Mistral, Qwen2, GPT-NeoX, torchtitan):
RMSNorm, `scaled_dot_product_attention`, `cat`/`stack`, `expand` (GQA's repeat_kv) and the complex views
of rotary embeddings. Same contract as `planner.capture_ops` (registered there with `@handles`); the same
canonical names come from torch-level calls (`F.rms_norm`, `torch.cat`, `x.expand`) and ATen ops
(`aten.rms_norm`, `aten.cat`, `aten.expand`).
"""

from __future__ import annotations

from typing import Any

from planner.capture_ops import Act, Call, _dim, handles

__all__: list[str] = []


@handles("rms_norm")
def _rms_norm(call: Call) -> tuple[str, dict[str, Any]]:
    # F.rms_norm(input, normalized_shape, weight=None, eps=None); aten.rms_norm(input, normalized_shape, weight, eps)
    shape, weight, eps = call.arg(1, "normalized_shape"), call.arg(2, "weight"), call.arg(3, "eps")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return "rms_norm", {"normalized_shape": shape, "eps": None if eps is None else float(eps),
                        "elementwise_affine": weight is not None}


@handles("scaled_dot_product_attention")
def _sdpa(call: Call) -> tuple[str, dict[str, Any]]:
    # (query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
    q, k, v = call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value")
    mask = call.arg(3, "attn_mask")
    if not all(isinstance(t, Act) for t in (q, k, v)) or (mask is not None and not isinstance(mask, Act)):
        return "other", {}
    if [a.index for a in (q, k, v)] != [0, 1, 2]:
        return "other", {}
    scale = call.arg(6, "scale")
    return "attention", {"is_causal": bool(call.arg(5, "is_causal", False)),
                         "dropout_p": float(call.arg(4, "dropout_p", 0.0)),
                         "scale": None if scale is None else float(scale),
                         "enable_gqa": bool(call.arg(7, "enable_gqa", False)),
                         "mask": None if mask is None else mask.index}


@handles("cat", "concat", "concatenate", "stack")
def _cat(call: Call) -> tuple[str, dict[str, Any]]:
    tensors = call.arg(0, "tensors")
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, Act) for t in tensors):
        return "other", {}
    stack = call.op == "stack"
    dim = int(call.arg(1, "dim", call.kwargs.get("axis", 0)))
    return "cat", {"dim": _dim(dim, len(call.outputs[0].shape)), "stack": stack}


@handles("expand", "expand_as", "broadcast_to")
def _expand(call: Call) -> tuple[str, dict[str, Any]]:
    if not call.in_meta or not isinstance(call.arg(0, "input"), Act):
        return "other", {}
    return "expand", {"shape": call.outputs[0].shape}


@handles("view_as_complex", "view_as_real")
def _complex_view(call: Call) -> tuple[str, dict[str, Any]]:
    return "complex_view", {"fn": call.op}
