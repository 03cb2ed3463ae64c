"""Pieces every Triton kernel of diffattn.gpu shares: whether the kernels run under Triton's
interpreter, the float32 product of two tiles, and masked tile loads.

Scores are kept in log2 units (the softmax scale folded with log2(e)), so the kernels call exp2;
the log-sum-exp they save is converted back to natural-log units, as the CPU contract stores it.
"""

import triton
import triton.language as tl
from triton import knobs

# @triton.jit decides at decoration time whether a kernel is compiled or interpreted (from
# TRITON_INTERPRET, through this knob); the kernel modules are decorated right after this one is
# imported, so the two agree.
INTERPRET = bool(knobs.runtime.interpret)

# The interpreter keeps bfloat16 tiles as their uint16 bit patterns and its tl.dot multiplies
# those integers (Triton 3.9), so under the interpreter every product widens its operands to
# float32 first. On a GPU a bf16 x bf16 product is exact in float32 and the MMA accumulates in
# float32, so the widened product is the same arithmetic up to the order of the sums.
_WIDEN_DOT = tl.constexpr(INTERPRET)

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453    # ln(2): a log2-unit log-sum-exp times LN2 is the natural one
# the same inside kernels (a @triton.jit function reads only constexpr globals)
LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)


@triton.jit
def mma(a, b, acc, DOT_PREC: tl.constexpr):
    """acc + a @ b in float32. a (M, K), b (K, N), acc (M, N) float32. DOT_PREC is "ieee" for
    float32 inputs (no TF32 rounding: float32 callers ask for float32 accuracy)."""
    if _WIDEN_DOT:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PREC)


@triton.jit
def load_tile(ptrs, rows, n_rows, cols, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """A (R, C) tile at ptrs; elements outside rows < n_rows or cols < n_cols read as 0. The
    checks are compile-time flags so a tile known to be inside its tensor loads unmasked."""
    if CHECK_ROWS:
        if CHECK_COLS:
            t = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
        else:
            t = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if CHECK_COLS:
            t = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
        else:
            t = tl.load(ptrs)
    return t


@triton.jit
def store_tile(ptrs, val, rows, n_rows, cols, n_cols, CHECK_COLS: tl.constexpr):
    """Store a (R, C) tile, rows < n_rows (always checked) and cols < n_cols (when CHECK_COLS)."""
    if CHECK_COLS:
        tl.store(ptrs, val, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    else:
        tl.store(ptrs, val, mask=rows[:, None] < n_rows)


def dot_precision(dtype_name):
    """The tl.dot input precision for a dtype: float32 inputs are multiplied in full precision."""
    return "ieee" if dtype_name == "float32" else "tf32"


def next_pow2(n):
    return triton.next_power_of_2(max(int(n), 1))
