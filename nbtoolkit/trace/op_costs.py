"""FLOPs and bytes of one aten op from the shapes a trace recorded (``record_shapes=True``).

The profiler records, per host op, ``Input Dims`` (one shape per input, ``[]`` for a
scalar), ``Input type`` (``float``, ``c10::BFloat16``, ``Scalar`` ...) and, in recent torch,
``Concrete Inputs`` (scalar values as text). From them:

==============  =====================================================================
class           FLOPs (one multiply-add = 2 FLOPs)
==============  =====================================================================
GEMM            ``mm`` and ``addmm`` [M,K]x[K,N]: 2MKN (the bias add not counted, as in
                torch's FLOP counter); ``bmm``/``baddbmm``
                [B,M,K]x[B,K,N]: 2BMKN; ``linear``/``matmul``: 2 x (rows of x) x K x N
conv            2 x N x K x prod(out spatial) x (C / groups) x prod(kernel); the output
                size from stride, padding and dilation when recorded (else stride 1,
                "same" padding); ``convolution_backward``: twice that (input and weight
                gradients), from the recorded gradient's shape
attention       scaled dot-product attention, q [B,H,L,D], k [B,H,S,D]: 4BHLSD
                forward, 8BHLSD backward (the two and four matrix products)
normalization   5 per element (mean, variance, normalise, scale, shift)
softmax         5 per element
elementwise     1 per element of the largest input
reduction       1 per input element
memory          0 (copies, indexing, concatenation, embedding lookups)
==============  =====================================================================

Bytes: every tensor input read once plus the output written once, the output taken as
the largest input (the GEMM/conv/attention outputs are computed); in-place ops (``..._``)
write their first input. This is the DRAM traffic of an ideal kernel, so the arithmetic
intensity is an upper bound and "memory-bound" a lower bound on the traffic's share.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["ELEMENT_BYTES", "OpCost", "op_class", "op_cost"]

ELEMENT_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}
_PRECISION = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "double": "fp64"}

_GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
         "aten::_addmm_activation", "aten::addmv", "aten::mv", "aten::dot", "aten::_scaled_mm"}
_MEMORY_WORDS = ("copy", "clone", "cat", "index", "embedding", "gather", "scatter", "contiguous",
                 "_to_copy", "stack", "pad", "fill", "zero", "empty", "view", "reshape", "slice")
_REDUCTIONS = ("sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin", "norm_")
# positions of (stride, padding, dilation) in the concrete inputs of each forward conv op
_CONV_ARGS = {
    "aten::convolution": (3, 4, 5), "aten::_convolution": (3, 4, 5), "aten::conv1d": (3, 4, 5),
    "aten::conv2d": (3, 4, 5), "aten::conv3d": (3, 4, 5), "aten::cudnn_convolution": (3, 2, 4),
    "aten::mkldnn_convolution": (4, 3, 5), "aten::miopen_convolution": (4, 3, 5),
}


class OpCost:
    """FLOPs, bytes, op class and precision (``fp32``/``bf16``/``fp16``/...; "" unknown) of one op."""

    __slots__ = ("bytes", "flops", "op_class", "precision")

    def __init__(self, op_class: str, flops: float, nbytes: float, precision: str) -> None:
        self.op_class, self.flops, self.bytes, self.precision = op_class, flops, nbytes, precision


def op_class(name: str) -> str:
    """The class of an aten op name (see the table in the module docstring)."""
    if name in _GEMM:
        return "GEMM"
    bare = name.removeprefix("aten::")
    if "convolution" in bare or bare.startswith("conv"):
        return "conv"
    if "attention" in bare:
        return "attention"
    if "norm" in bare and not bare.startswith("norm"):
        return "normalization"
    if "softmax" in bare:
        return "softmax"
    if any(word in bare for word in _MEMORY_WORDS):
        return "memory"
    if bare.startswith(_REDUCTIONS):
        return "reduction"
    return "elementwise"


def op_cost(name: str, dims: list[Any], types: list[Any], concrete: list[Any] | None = None) -> OpCost | None:
    """FLOPs and bytes of one recorded op, or None when it has no tensor input."""
    tensors = [(list(d), str(t)) for d, t in zip(dims, types, strict=False)
               if isinstance(d, list) and str(t) in ELEMENT_BYTES]
    if not tensors:
        return None
    sizes = [(math.prod(d) if d else 1, ELEMENT_BYTES[t]) for d, t in tensors]
    read = float(sum(n * b for n, b in sizes))
    largest = max(sizes, key=lambda s: s[0] * s[1])
    precision = next((_PRECISION[t] for _, t in tensors if t in _PRECISION), "")
    cls = op_class(name)
    shapes = [d for d, _ in tensors]
    flops, out_elems = _flops(name, cls, shapes, dims, concrete or [])
    if cls == "memory" and ("embedding" in name or "index" in name) and len(tensors) >= 2:
        # a lookup reads the rows it gathers, not the whole table: out = indices x row size
        by_size = sorted(tensors, key=lambda t: math.prod(t[0] or [1]))
        index, table = by_size[0], by_size[-1]
        row = math.prod(table[0][1:]) if len(table[0]) > 1 else 1
        out = math.prod(index[0] or [1]) * row * ELEMENT_BYTES[table[1]]
        return OpCost(cls, 0.0, 2.0 * out + math.prod(index[0] or [1]) * ELEMENT_BYTES[index[1]], precision)
    out_count = float(out_elems if out_elems is not None else largest[0])
    written = 0.0 if name.endswith("_") else out_count * largest[1]
    return OpCost(cls, flops, read + written, precision)


def _flops(name: str, cls: str, shapes: list[list[int]], dims: list[Any],
           concrete: list[Any]) -> tuple[float, float | None]:
    numel = max(math.prod(s) if s else 1 for s in shapes)
    if cls == "GEMM":
        return _gemm(name, shapes)
    if cls == "conv":
        return _conv(name, shapes, concrete)
    if cls == "attention" and len(shapes) >= 2 and len(shapes[0]) == 4 and len(shapes[1]) == 4:
        q, k = (shapes[1], shapes[2]) if "backward" in name and len(shapes) >= 3 else (shapes[0], shapes[1])
        if name.startswith(("aten::_flash_attention", "aten::_efficient_attention")):
            b, seq, h, d = q  # these kernels' entry points take [batch, seq, heads, dim]
            s = k[1]
        else:
            b, h, seq, d = q  # scaled_dot_product_*: [batch, heads, seq, dim]
            s = k[2]
        per = 8.0 if "backward" in name else 4.0
        return per * b * h * seq * s * d, None
    per_element = {"normalization": 5.0, "softmax": 5.0, "elementwise": 1.0, "reduction": 1.0}
    return per_element.get(cls, 0.0) * numel, None


def _gemm(name: str, shapes: list[list[int]]) -> tuple[float, float | None]:
    mats = [s for s in shapes if len(s) >= 2]
    if name in ("aten::linear", "aten::matmul") and len(mats) >= 2:
        x, w = mats[0], mats[1]
        rows = math.prod(x[:-1])
        n = w[0] if name == "aten::linear" else w[-1]
        return 2.0 * rows * x[-1] * n, float(rows * n)
    if name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation") and len(mats) >= 3:
        mats = mats[1:]  # a 2-d (or batched) bias first; a 1-d bias is not in mats
    if len(mats) < 2:
        return 0.0, None
    a, b = mats[0], mats[1]
    batch = math.prod(a[:-2]) if len(a) > 2 else 1
    m, k, n = a[-2], a[-1], b[-1]
    return 2.0 * batch * m * k * n, float(batch * m * n)  # the bias add is not counted (as torch's counter)


def _conv(name: str, shapes: list[list[int]], concrete: list[Any]) -> tuple[float, float | None]:
    if "backward" in name:  # (grad_output [N,K,*out], input [N,C,*in], weight [K,C/g,*kernel], ...)
        if len(shapes) < 3:
            return 0.0, None
        grad, weight = shapes[0], shapes[2]
        return 4.0 * grad[0] * grad[1] * math.prod(grad[2:]) * weight[1] * math.prod(weight[2:]), None
    if len(shapes) < 2 or len(shapes[0]) < 3:
        return 0.0, None
    x, weight = shapes[0], shapes[1]
    spatial = x[2:]
    kernel = weight[2:]
    at = _CONV_ARGS.get(name, (-1, -1, -1))
    stride = _ints(concrete, at[0], len(spatial)) or [1] * len(spatial)
    padding = _ints(concrete, at[1], len(spatial))
    dilation = _ints(concrete, at[2], len(spatial)) or [1] * len(spatial)
    if padding is None:  # not recorded: "same" padding
        padding = [(dilation[i] * (kernel[i] - 1)) // 2 for i in range(len(spatial))]
    out = [
        (spatial[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
        for i in range(len(spatial))
    ]
    out_elems = x[0] * weight[0] * math.prod(out)
    return 2.0 * out_elems * weight[1] * math.prod(kernel), float(out_elems)


def _ints(concrete: list[Any], index: int, rank: int) -> list[int] | None:
    """The recorded int-list argument at ``index`` (one value per spatial dim), or None."""
    value: Any = None
    if 0 <= index < len(concrete) and concrete[index] not in ("", None):
        try:
            value = json.loads(str(concrete[index]))
        except ValueError:
            value = None
    if isinstance(value, int):
        return [value] * rank
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return (value * rank)[:rank] if len(value) == 1 else value[:rank]
    return None
