"""diffattn.gpu: fused Triton kernels for differential attention (placeholder docstring)."""

from . import _configs  # noqa: F401
from .interface import (  # noqa: F401
    attention_bwd,
    attention_fwd,
    attention_varlen_bwd,
    attention_varlen_fwd,
    attention_with_kvcache,
    diff_attention_bwd,
    diff_attention_fwd,
    diff_attention_varlen_bwd,
    diff_attention_varlen_fwd,
    diff_attention_with_kvcache,
)
from .interface import __all__  # noqa: F401
