"""diffattn's safetensors reader against the safetensors library (the format's reference reader) on
crafted files: for every file, both accept it or both refuse it, and what both accept reads as the
same tensors and metadata. The cases are the format's edges (gaps before, between and after the
data, overlaps, empty tensors, repeated keys, header bytes serde refuses and nlohmann did not) and
a few hundred seeded byte mutations of valid files. The only refusal of diffattn's own is a dtype
it does not compute with (I64, F64, ...), which it names."""

import json
import random
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import diffattn

SUPPORTED = {"F32", "BF16", "F16"}


def pack(header, data=b"", raw=None):
    h = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


F32x6 = np.arange(6, dtype=np.float32).tobytes()
HALF = np.arange(4, dtype=np.float16).tobytes()
A = entry("F32", [2, 3], 0, 24)
A_RAW = b'"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}'

CASES = {
    "exact": pack({"a": A}, F32x6),
    "two_tensors_any_key_order": pack({"b": entry("F16", [4], 24, 32), "a": A}, F32x6 + HALF),
    "bf16": pack({"w": entry("BF16", [2, 2], 0, 8)}, HALF),
    "metadata": pack({"__metadata__": {"format": "pt"}, "a": A}, F32x6),
    "metadata_null": pack({"__metadata__": None, "a": A}, F32x6),
    "metadata_not_strings": pack({"__metadata__": {"k": 1}, "a": A}, F32x6),
    "metadata_nested": pack({"__metadata__": {"k": {"x": "y"}}, "a": A}, F32x6),
    "metadata_list": pack({"__metadata__": ["x"], "a": A}, F32x6),
    "no_tensors": pack({}),
    "no_tensors_one_byte": pack({}, b"\0"),
    "empty_tensor_at_end": pack({"a": A, "z": entry("F32", [0], 24, 24)}, F32x6),
    "empty_tensor_at_start": pack({"a": A, "z": entry("F32", [0, 5], 0, 0)}, F32x6),
    "empty_tensor_inside": pack({"a": A, "z": entry("F32", [0], 4, 4)}, F32x6),
    "gap_before": pack({"a": entry("F32", [2, 3], 4, 28)}, b"\0" * 4 + F32x6),
    "gap_between": pack({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, b"\0" * 12),
    "tail": pack({"a": A}, F32x6 + b"\0" * 8),
    "long_tail": pack({"a": A}, F32x6 + b"\0" * 4096),
    "overlap": pack({"a": A, "b": entry("F32", [1], 20, 24)}, F32x6),
    "same_range_twice": pack({"a": A, "b": A}, F32x6),
    "short_range": pack({"a": entry("F32", [2, 3], 0, 20)}, F32x6[:20]),
    "offsets_past_end": pack({"a": entry("F32", [2, 3], 0, 28)}, F32x6),
    "offsets_reversed": pack({"a": entry("F32", [0], 4, 0)}, b"\0" * 4),
    "repeated_tensor_last_wins": pack(None, F32x6, raw=b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},' + A_RAW + b'}'),
    "repeated_tensor_last_short": pack(None, F32x6, raw=b'{' + A_RAW + b',"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}'),
    "repeated_metadata_key": pack(None, F32x6, raw=b'{"__metadata__":{"k":"a","k":"b"},' + A_RAW + b'}'),
    "repeated_metadata": pack(None, F32x6, raw=b'{"__metadata__":{"k":"a"},"__metadata__":{"k":"b"},' + A_RAW + b'}'),
    "repeated_field": pack(None, F32x6, raw=b'{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"dtype":"F16"}}'),
    "extra_field": pack({"a": dict(A, note="x")}, F32x6),
    "missing_dtype": pack({"a": {"shape": [2, 3], "data_offsets": [0, 24]}}, F32x6),
    "entry_null": pack({"a": None}, F32x6),
    "entry_list": pack({"a": [1, 2]}, F32x6),
    "lowercase_dtype": pack({"a": entry("f32", [2, 3], 0, 24)}, F32x6),
    "unknown_dtype": pack({"a": entry("F31", [2, 3], 0, 24)}, F32x6),
    "dtype_number": pack({"a": dict(A, dtype=32)}, F32x6),
    "shape_float": pack(None, F32x6, raw=b'{"a":{"dtype":"F32","shape":[2.0,3],"data_offsets":[0,24]}}'),
    "shape_exponent": pack(None, F32x6, raw=b'{"a":{"dtype":"F32","shape":[2e0,3],"data_offsets":[0,24]}}'),
    "shape_minus_zero": pack(None, b"", raw=b'{"a":{"dtype":"F32","shape":[-0,3],"data_offsets":[0,0]}}'),
    "shape_negative": pack({"a": entry("F32", [-2, 3], 0, 24)}, F32x6),
    "shape_not_list": pack({"a": entry("F32", 6, 0, 24)}, F32x6),
    "shape_overflow": pack({"a": entry("F32", [1 << 62, 8], 0, 24)}, F32x6),
    "shape_scalar": pack({"a": entry("F32", [], 0, 4)}, F32x6[:4]),
    "offsets_three": pack({"a": dict(A, data_offsets=[0, 24, 24])}, F32x6),
    "offsets_float": pack(None, F32x6, raw=b'{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24.0]}}'),
    "offsets_negative": pack(None, F32x6, raw=b'{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[-0,24]}}'),
    "header_leading_spaces": pack(None, F32x6, raw=b"  {" + A_RAW + b"}"),
    "header_trailing_spaces": pack(None, F32x6, raw=b"{" + A_RAW + b"}      "),
    "header_trailing_nul": pack(None, F32x6, raw=b"{" + A_RAW + b"}\0"),
    "header_nul_then_garbage": pack(None, F32x6, raw=b"{" + A_RAW + b"}\0garbage"),
    "header_bom": pack(None, F32x6, raw=b"\xef\xbb\xbf{" + A_RAW + b"}"),
    "header_trailing_garbage": pack(None, F32x6, raw=b"{" + A_RAW + b"}x"),
    "header_comment": pack(None, F32x6, raw=b"{" + A_RAW + b"/*c*/}"),
    "header_not_object": pack(None, b"", raw=b"[]"),
    "header_empty": pack(None, b"", raw=b""),
    "header_invalid_utf8": pack(None, F32x6, raw=b'{"\xff":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}'),
    "header_lone_surrogate": pack(None, F32x6, raw=b'{"\\ud800":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}'),
    "header_escaped_name": pack(None, F32x6, raw=b'{"\\u0061\\u0000":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}'),
    "header_length_too_big": struct.pack("<Q", 100_000_001) + b"{}",
    "header_length_past_end": struct.pack("<Q", 64) + b"{}",
    "header_length_huge": struct.pack("<Q", (1 << 64) - 1) + b"{}",
    "shorter_than_8": b"\x02\0\0\0",
    "empty_file": b"",
}


def library_verdict(path):
    try:
        return "ok", load_file(path)
    except Exception as e:  # the library's errors (SafetensorError, others)
        return "error", str(e)


def dtypes_of(raw):
    """The dtypes a file's header names, or None when it cannot be read as a header."""
    try:
        (n,) = struct.unpack("<Q", raw[:8])
        h = json.loads(raw[8:8 + n])
        return {v["dtype"] for k, v in h.items() if k != "__metadata__"}
    except Exception:
        return None


def check_agreement(tmp_path, name, raw):
    p = tmp_path / (name + ".safetensors")
    p.write_bytes(raw)
    lib, got = library_verdict(str(p))
    try:
        ours = "ok", diffattn.read_safetensors(str(p))
    except OSError as e:
        ours = "error", str(e)
    if lib == "ok" and not (dtypes_of(raw) or set()) <= SUPPORTED:
        # Well formed, but of a dtype diffattn does not compute with: refused by name.
        assert ours[0] == "error" and "is not supported (F32, BF16 or F16)" in ours[1], (name, ours)
        return lib
    assert ours[0] == lib, f"{name}: the library says {lib} ({got if lib == 'error' else ''}), diffattn {ours}"
    if lib == "ok":
        tensors, metadata = ours[1]
        assert sorted(tensors) == sorted(got), name
        for k, t in got.items():
            assert np.array_equal(tensors[k], t.to(torch.float32).numpy()), (name, k)
        assert isinstance(metadata, dict)
    else:
        assert str(p) in ours[1], f"{name}: the error does not name the file: {ours[1]}"
    return lib


@pytest.mark.parametrize("name", sorted(CASES))
def test_crafted_file_verdicts_agree(tmp_path, name):
    check_agreement(tmp_path, name, CASES[name])


def test_gaps_and_tails_are_refused_by_name(tmp_path):
    for name, words in [("gap_before", "a gap of 4 bytes"), ("tail", "8 bytes after the last tensor"),
                        ("gap_between", "\"b\" begins at data byte 8, expected 4"),
                        ("overlap", "overlaps the tensor before it")]:
        p = tmp_path / (name + ".safetensors")
        p.write_bytes(CASES[name])
        with pytest.raises(OSError, match=words):
            diffattn.read_safetensors(str(p))


def test_unsupported_dtypes_are_named(tmp_path):
    p = tmp_path / "i64.safetensors"
    p.write_bytes(pack({"ids": entry("I64", [3], 0, 24)}, b"\0" * 24))
    assert library_verdict(str(p))[0] == "ok"
    with pytest.raises(OSError, match=r"tensor \"ids\": dtype I64 is not supported \(F32, BF16 or F16\)"):
        diffattn.read_safetensors(str(p))


def test_mutated_files_verdicts_agree(tmp_path):
    # Seeded mutations of valid files: flipped, inserted and deleted bytes, anywhere (the length
    # prefix, the header, the data); each verdict is compared with the library's.
    bases = [CASES["exact"], CASES["two_tensors_any_key_order"], CASES["metadata"],
             CASES["empty_tensor_at_end"]]
    rng = random.Random(24)
    accepted = refused = 0
    for i in range(600):
        raw = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            op, at = rng.randrange(3), rng.randrange(len(raw) + 1)
            if op == 0 and at < len(raw):
                raw[at] = rng.choice([rng.randrange(256), ord(rng.choice('{}[]",:0123456789 -.e\\'))])
            elif op == 1:
                raw[at:at] = bytes([rng.randrange(256)])
            elif at < len(raw):
                del raw[at]
        verdict = check_agreement(tmp_path, f"mutant{i}", bytes(raw))
        accepted += verdict == "ok"
        refused += verdict == "error"
    assert accepted > 10 and refused > 100, (accepted, refused)
