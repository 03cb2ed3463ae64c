"""Argument checks shared by diffattn.torch's operators and modules: every error names the
operator, the argument and what is wrong, before any work is done."""

import math

import torch

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# The devices that have kernels: CPU (the C++ kernels, or Triton's interpreter with
# backend="triton") and CUDA (the Triton kernels of diffattn.gpu).
_DEVICES = ("cpu", "cuda")
BACKENDS = ("auto", "fused", "reference", "triton")


def check_tensor(op, name, x, dims):
    """x must be a floating tensor on a device with kernels, with one of the ranks in dims."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type not in _DEVICES:
        raise ValueError(f"{op}: {name} is on device {x.device}; diffattn.torch has kernels for "
                         f"CPU and CUDA tensors")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; expected one of float32, float64, "
                        f"float16, bfloat16")
    if x.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{op}: {name} must have {want} dimensions, got shape {tuple(x.shape)}")


def check_flags(op, causal, scale):
    """causal a bool; scale None or a finite non-zero number (returned as a float)."""
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"{op}: scale must be a number or None, got {type(scale).__name__}")
        scale = float(scale)
        if not math.isfinite(scale) or scale == 0.0:
            raise ValueError(f"{op}: scale must be finite and non-zero, got {scale}")
    return scale


def check_backend(op, backend):
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def _names(xs):
    names = list(xs)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def check_same(op, **xs):
    """The tensors share one dtype and one device."""
    dtypes = {n: x.dtype for n, x in xs.items()}
    if len(set(dtypes.values())) > 1:
        got = ", ".join(f"{n} {d}" for n, d in dtypes.items())
        raise TypeError(f"{op}: {_names(xs)} must share one dtype, got {got}")
    devices = {n: x.device for n, x in xs.items()}
    if len(set(devices.values())) > 1:
        got = ", ".join(f"{n} {d}" for n, d in devices.items())
        raise ValueError(f"{op}: {_names(xs)} must be on one device, got {got}")


def check_positive_int(op, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{op}: {name} must be a positive integer, got {value!r}")
    return value


def check_non_negative_int(op, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{op}: {name} must be a non-negative integer, got {value!r}")
    return value


def as_f32(x):
    """float32 x: the tensor itself when it already is one (no copy)."""
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def materialised(x):
    """x with distinct elements: a tensor with a stride of 0 (from expand()) is copied, because
    the kernels write each gradient in its input's layout; autograd sums the gradient back over
    the expanded dimension. Anything else is returned as it is (strided views are read in
    place)."""
    if any(s == 0 for s, n in zip(x.stride(), x.shape) if n > 1):
        return x.contiguous()
    return x
