"""diffattn: differential attention (arXiv:2410.05258) and the Differential Transformer.

The operators take NumPy float32 arrays in (batch, seq, head, dim) order; q, k and v may be
strided views (a contiguous last dimension; read in place, no copy):

    out = diffattn.diff_attention(q, k, v, lam, causal=False, scale=None, mode="signed")
    dq, dk, dv, dlam = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=False)
    out = diffattn.attention(q, k, v, causal=False)
    dq, dk, dv = diffattn.attention_backward(q, k, v, dout, causal=False)

A training step keeps the forward's saved statistics and hands them to the backward, which
then runs no forward of its own:

    out, lse, o2 = diffattn.diff_attention(q, k, v, lam, causal=True, return_stats=True)
    dq, dk, dv, dlam = diffattn.diff_attention_backward(q, k, v, lam, dout, causal=True,
                                                        out=out, lse=lse, o2=o2)

A trained model directory (docs/FORMAT.md) loads as

    m = diffattn.load_model(path)
    logits = m.forward(tokens)            # int64 (B, T) -> float32 (B, T, vocab)
    loss = m.loss(tokens, targets)        # mean cross-entropy over all positions
    grads = m.gradients(tokens, targets)  # {FORMAT.md tensor name: array}

PyTorch: `import diffattn.torch` for autograd operators on torch tensors, drop-in attention
modules (MultiheadDiffAttn, MultiheadDiffAttnV2, DiffLlamaAttention), load/save of a model
directory as an nn.Module, and ring attention on torch.distributed.

Anything else (another dtype, a non-contiguous last dimension, negative strides, inconsistent
shapes, a NaN lambda) raises ValueError naming the tensor, the expected and the actual shape.
backend="reference" (or the environment variable DIFFATTN_BACKEND=reference, read once when
the first operator runs) forces the reference implementation.
"""

import os as _os

# Idle OpenMP threads spin for a while before they sleep, which on a busy machine steals cycles
# from the working ones, and on a quiet one is faster. As the diffattn tool does: wait passively
# when the machine is busy at import (one-minute load average at least half its processors).
# libgomp reads this when it loads (with _core below, unless another module loaded it first).
# A policy the user set is kept.
def _machine_busy():
    try:
        return _os.getloadavg()[0] >= 0.5 * (_os.cpu_count() or 1)
    except OSError:
        return False


if "OMP_WAIT_POLICY" not in _os.environ and _machine_busy():
    _os.environ["OMP_WAIT_POLICY"] = "passive"

try:
    from ._core import *  # noqa: F401,F403
    from ._core import __doc__ as _core_doc  # noqa: F401
except ImportError as _e:  # the compiled core is absent (a GPU machine with only the sources)
    _core_error = _e

    def __getattr__(name):
        # diffattn.gpu (the Triton kernels) imports without the core; everything else needs it.
        if name == "gpu":
            import importlib
            return importlib.import_module(".gpu", __name__)
        raise ImportError(f"diffattn.{name} needs the compiled core diffattn._core, which did not "
                          f"import ({_core_error}); build and install the package with "
                          f"`pip install .` (diffattn.gpu works without it)")

if "_core_error" not in globals():
    from ._core import __version__  # noqa: F401  (CMakeLists.txt's project version)
else:
    try:
        from importlib.metadata import version as _version
        __version__ = _version("diffattn")
    except Exception:  # sources on a path, not installed
        __version__ = "unknown"
