"""Tile sizes and launch settings of every kernel of diffattn.gpu, one table per kernel.

Each table gives, for a problem's key (maps, head dims, element size), a list of candidate
tilings; the first is the default (one that keeps its accumulators in registers where the
compile check found one). Defaults were chosen for the H100 by compiling every
candidate for sm_90 on a CPU machine (scripts/gpu_compile_check.py: registers, spills, shared
memory), not by timing: timing needs the GPU. With DIFFATTN_TRITON_AUTOTUNE=1 (or
autotune(True)) the first call of each key on a CUDA device times every candidate and keeps the
fastest; tuned() lists the choices, so a GPU session can report them and move the winners to
the front of these tables.

Under TRITON_INTERPRET=1 (kernels on CPU tensors) every kernel runs one small tiling, so tests
are fast and the small shapes they use still span several tiles; force() lets a test pick
another (and the number of splits of the key-block backward and of decode).
"""

import contextlib
import os
from dataclasses import asdict, dataclass

from ._common import INTERPRET


@dataclass(frozen=True)
class Tiles:
    BLOCK_M: int     # query rows per tile (decode: the cap on stacked query rows per program)
    BLOCK_N: int     # keys per tile
    num_warps: int
    num_stages: int


T = Tiles

# Keys: (maps, BLOCK_D, BLOCK_DV) for 16-bit inputs, where the compile check measured them;
# (maps, "*", BLOCK_DV) is the fallback for other head dims and ("f32", maps) for float32
# inputs (products without tensor-core TF32: small tiles). Comments: registers per thread on
# sm_90 from scripts/gpu_compile_check.py (no spills unless said).

# forward (_fwd.attn_fwd_kernel). Registers from Triton 3.6 (the GPU machines' version), with the
# single key loop of _fwd.py; every candidate keeps its accumulators in registers. The first
# H100 run (docs/PERFORMANCE.md) measured the old two-loop kernel spilling at these tiles.
_FWD = {
    (1, 64, 64): [T(128, 64, 8, 3), T(128, 128, 8, 2), T(64, 64, 4, 3),        # 115, 180, 128
                  T(128, 64, 4, 3)],                                           # 230
    (1, 128, 128): [T(128, 64, 8, 3), T(128, 128, 8, 2), T(64, 64, 4, 3),      # 172, 241, 168
                    T(128, 32, 8, 3)],                                         # 127
    (2, 64, 128): [T(128, 64, 8, 2), T(64, 64, 8, 3), T(128, 32, 8, 3),        # 255, 182, 225
                   T(64, 128, 8, 2)],                                          # 216
    (2, 128, 128): [T(128, 32, 8, 3), T(64, 64, 8, 3), T(128, 64, 8, 2),       # 228, 192, 255
                    T(64, 32, 8, 3)],                                          # 149
    (2, 128, 256): [T(64, 32, 8, 3), T(64, 64, 8, 2), T(64, 32, 8, 2)],        # 226, 245, 218
    (1, "*", 64): [T(128, 64, 8, 3), T(64, 64, 4, 3)],
    (1, "*", 128): [T(128, 64, 8, 3), T(64, 64, 4, 3)],
    (1, "*", 256): [T(64, 32, 8, 3), T(64, 64, 8, 2)],
    (2, "*", 64): [T(128, 64, 8, 3), T(64, 64, 4, 3), T(128, 32, 8, 3)],
    (2, "*", 128): [T(128, 32, 8, 3), T(64, 64, 8, 3)],
    (2, "*", 256): [T(64, 32, 8, 3), T(64, 32, 8, 2)],
    ("f32", 1): [T(64, 16, 8, 2), T(32, 16, 8, 2)],
    ("f32", 2): [T(64, 16, 8, 2), T(32, 16, 8, 2), T(32, 32, 8, 2)],          # 230, 166, 255
}

# backward, key blocks (_bwd.attn_bwd_dkdv_kernel): BLOCK_N keys owned, BLOCK_M query rows a
# step. With the atomic dQ this kernel holds dK1, dK2, dV and K1, K2, V: V1 at D = 128 finds no
# wgmma tiling without spills (M64 N32 w8: 176 B, M16 N64 w8: 232 B; the defaults use mma.sync).
_BWD_DKDV = {
    (1, 64, 64): [T(32, 128, 8, 2), T(64, 128, 8, 2), T(32, 64, 4, 3),         # 213, 254, 233
                  T(64, 64, 8, 2)],                                            # 252
    (1, 128, 128): [T(16, 128, 8, 2), T(32, 64, 8, 2), T(32, 128, 8, 2)],      # 229, 225, 4 B
    (2, 64, 128): [T(16, 64, 8, 2), T(16, 128, 8, 2), T(64, 32, 8, 2),         # 248, 32 B, 12 B
                   T(32, 32, 8, 2)],                                           # 182 (mma)
    (2, 128, 128): [T(32, 32, 8, 2), T(16, 32, 8, 2), T(64, 32, 8, 2),         # 249, 218, 16 B
                    T(16, 64, 8, 2)],                                          # 40 B spilled
    (2, 128, 256): [T(32, 32, 8, 2), T(16, 32, 8, 2), T(64, 32, 8, 2),         # 252, 206, 176 B
                    T(16, 64, 8, 2)],                                          # 232 B spilled
    (1, "*", 64): [T(32, 64, 4, 3), T(32, 128, 8, 2)],
    (1, "*", 128): [T(32, 64, 8, 2), T(32, 128, 8, 2)],
    (1, "*", 256): [T(32, 32, 8, 2), T(16, 64, 8, 2)],
    (2, "*", 64): [T(32, 64, 8, 2), T(16, 64, 8, 2)],
    (2, "*", 128): [T(32, 32, 8, 2), T(64, 32, 8, 2)],
    (2, "*", 256): [T(32, 32, 8, 2), T(16, 32, 8, 2)],
    ("f32", 1): [T(32, 16, 8, 2), T(16, 16, 8, 2)],
    ("f32", 2): [T(32, 16, 8, 2), T(16, 16, 8, 2)],                            # 104, 102
}

# backward, deterministic dQ (_bwd.attn_bwd_dq_kernel): BLOCK_M rows owned, BLOCK_N keys a step
_BWD_DQ = {
    (1, 128, 128): [T(128, 32, 8, 2), T(64, 64, 4, 2)],                        # 134, 190
    (2, 128, 256): [T(64, 32, 8, 2), T(32, 32, 4, 2)],                         # 227, 218
    (1, "*", 64): [T(128, 32, 4, 3), T(64, 64, 4, 2)],
    (1, "*", 128): [T(128, 32, 8, 2), T(64, 64, 4, 2)],
    (1, "*", 256): [T(64, 32, 8, 2), T(64, 16, 4, 2)],
    (2, "*", 64): [T(64, 32, 4, 2), T(128, 32, 8, 2)],
    (2, "*", 128): [T(64, 32, 8, 2), T(128, 32, 8, 2)],
    (2, "*", 256): [T(64, 32, 8, 2), T(32, 32, 4, 2)],
    ("f32", 1): [T(32, 16, 8, 2), T(16, 32, 8, 2)],
    ("f32", 2): [T(32, 16, 8, 2), T(16, 32, 8, 2)],                            # 78, 71
}

# decode split kernel (_decode.attn_decode_split_kernel): BLOCK_M caps the stacked rows
_DECODE = {
    (1, "*", 64): [T(64, 64, 4, 3), T(64, 128, 4, 3), T(64, 32, 4, 4)],
    (1, "*", 128): [T(64, 64, 4, 3), T(64, 128, 8, 3), T(64, 32, 4, 4)],
    (1, "*", 256): [T(32, 64, 4, 3), T(32, 32, 4, 4)],
    (2, "*", 64): [T(64, 64, 4, 3), T(64, 128, 8, 3), T(64, 32, 4, 4)],
    (2, "*", 128): [T(64, 64, 4, 3), T(64, 128, 8, 3), T(64, 32, 4, 4)],
    (2, "*", 256): [T(32, 64, 4, 3), T(32, 32, 4, 4), T(32, 64, 8, 3)],
    ("f32", 1): [T(32, 32, 4, 3)],
    ("f32", 2): [T(16, 32, 4, 3)],
}

_TABLES = {"fwd": _FWD, "bwd_dkdv": _BWD_DKDV, "bwd_dq": _BWD_DQ, "decode": _DECODE}

# Under the interpreter: small tiles, BLOCK_M != BLOCK_N so a mix-up of the two shows.
_INTERPRET_TILES = {
    "fwd": Tiles(16, 32, 1, 1),
    "bwd_dkdv": Tiles(16, 32, 1, 1),
    "bwd_dq": Tiles(32, 16, 1, 1),
    "decode": Tiles(16, 16, 1, 1),
}

MERGE_BLOCK_C = 64          # value columns per program of the decode merge

_forced = {}
_autotune = os.environ.get("DIFFATTN_TRITON_AUTOTUNE", "0") not in ("", "0")
_tuned = {}


def candidates(kernel, maps, block_d, block_dv, elem_bytes):
    """The candidate tilings of a kernel for a problem, the default first."""
    if kernel in _forced:
        return [_forced[kernel]]
    if INTERPRET:
        return [_INTERPRET_TILES[kernel]]
    table = _TABLES[kernel]
    if elem_bytes > 2:
        return table[("f32", maps)]
    bucket = 64 if block_dv <= 64 else (128 if block_dv <= 128 else 256)
    return table.get((maps, block_d, block_dv)) or table[(maps, "*", bucket)]


def forced(name, default=None):
    """A forced setting other than a tiling (e.g. "bwd_splits", "decode_splits"), or default."""
    return _forced.get(name, default)


@contextlib.contextmanager
def force(**settings):
    """Within the block, use the given tilings (fwd=Tiles(...), ...) or settings
    (bwd_splits=2, decode_splits=3): for tests that must reach a particular code path."""
    old = dict(_forced)
    _forced.update(settings)
    try:
        yield
    finally:
        _forced.clear()
        _forced.update(old)


def autotune(enabled=True, kernels=None):
    """Time every candidate on a CUDA device at the first call of each problem key; kernels
    (e.g. {"fwd"}) limits it to those tables."""
    global _autotune
    if kernels is not None:
        unknown = set(kernels) - set(_TABLES)
        if unknown:
            raise ValueError(f"autotune: no kernel table {sorted(unknown)}; the tables are "
                             f"{sorted(_TABLES)}")
        _autotune = frozenset(kernels) if enabled else False
    else:
        _autotune = bool(enabled)


def tuned():
    """The tilings autotuning chose so far: {"kernel key": {BLOCK_M, BLOCK_N, ...}}."""
    return {f"{kernel} {key}": asdict(t) for (kernel, key), t in _tuned.items()}


def pick(kernel, key, cands, run, device):
    """The tiling to launch with. run(tiles) launches the kernel (it may be called several times
    while tuning; its results are then recomputed by the caller's launch with the winner)."""
    tuning = _autotune if isinstance(_autotune, bool) else kernel in _autotune
    if len(cands) == 1 or not tuning or device.type != "cuda" or kernel in _forced:
        return cands[0]
    if (kernel, key) in _tuned:
        return _tuned[(kernel, key)]
    import triton.testing
    best, best_ms = cands[0], float("inf")
    for t in cands:
        try:
            ms = triton.testing.do_bench(lambda: run(t), warmup=3, rep=15)
        except Exception as e:  # a tiling that does not fit (shared memory, registers) is skipped
            if "OutOfResources" not in type(e).__name__ and "out of resource" not in str(e):
                raise
            continue
        if ms < best_ms:
            best, best_ms = t, ms
    _tuned[(kernel, key)] = best
    return best
