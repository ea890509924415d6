"""Counter-based noise exactly as docs/generation.md specifies.

Philox4x32-10 is evaluated vectorised in numpy with uint64 arithmetic (every product of two
u32 words fits in u64, so `mulhilo` is a plain multiply, a shift and a mask).  The result is a
pure function of (seed, prompt index, draw, element), which is what lets the Rust runner
reproduce the same bits without sharing any generator state.
"""

from __future__ import annotations

import numpy as np

M0 = np.uint64(0xD2511F53)
M1 = np.uint64(0xCD9E8D57)
W0 = 0x9E3779B9
W1 = 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)
TAG = 0x756E7374  # ASCII "unst", the fourth counter word
SHIFT32 = np.uint64(32)


def philox4x32_10(c0, c1, c2, c3, k0: int, k1: int):
    """Philox4x32 with 10 rounds over arrays of counters (uint64 arrays holding u32 values).

    Follows Random123: round, then bump the key, ten rounds in all (nine bumps)."""
    c0 = np.asarray(c0, dtype=np.uint64)
    c1 = np.broadcast_to(np.asarray(c1, dtype=np.uint64), c0.shape)
    c2 = np.broadcast_to(np.asarray(c2, dtype=np.uint64), c0.shape)
    c3 = np.broadcast_to(np.asarray(c3, dtype=np.uint64), c0.shape)
    k0 &= 0xFFFFFFFF
    k1 &= 0xFFFFFFFF
    for r in range(10):
        if r > 0:
            k0 = (k0 + W0) & 0xFFFFFFFF
            k1 = (k1 + W1) & 0xFFFFFFFF
        p0 = M0 * c0  # < 2^64, no overflow
        p1 = M1 * c2
        hi0, lo0 = p0 >> SHIFT32, p0 & MASK32
        hi1, lo1 = p1 >> SHIFT32, p1 & MASK32
        c0, c1, c2, c3 = (
            hi1 ^ c1 ^ np.uint64(k0),
            lo1,
            hi0 ^ c3 ^ np.uint64(k1),
            lo0,
        )
    return c0, c1, c2, c3


def normals(seed: int, prompt: int, draw: int, count: int) -> np.ndarray:
    """`count` standard normals (float32) for elements 0..count-1 of draw `draw` of prompt `prompt`."""
    blocks = (count + 3) // 4
    k = np.arange(blocks, dtype=np.uint64)
    r0, r1, r2, r3 = philox4x32_10(
        k, draw & 0xFFFFFFFF, prompt & 0xFFFFFFFF, TAG, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    )
    s = 2.0 ** -24
    u1 = ((r0 >> np.uint64(8)).astype(np.float64) + 1.0) * s
    u2 = (r1 >> np.uint64(8)).astype(np.float64) * s
    u3 = ((r2 >> np.uint64(8)).astype(np.float64) + 1.0) * s
    u4 = (r3 >> np.uint64(8)).astype(np.float64) * s
    ra = np.sqrt(-2.0 * np.log(u1))
    rb = np.sqrt(-2.0 * np.log(u3))
    out = np.empty((blocks, 4), dtype=np.float64)
    out[:, 0] = ra * np.cos(2.0 * np.pi * u2)
    out[:, 1] = ra * np.sin(2.0 * np.pi * u2)
    out[:, 2] = rb * np.cos(2.0 * np.pi * u4)
    out[:, 3] = rb * np.sin(2.0 * np.pi * u4)
    return out.reshape(-1)[:count].astype(np.float32)


def noise(seed: int, prompt: int, draw: int, shape) -> np.ndarray:
    """A tensor of `shape` filled in C order from draw `draw`."""
    count = int(np.prod(shape))
    return normals(seed, prompt, draw, count).reshape(shape)


# Random123 known-answer vectors for philox4x32_10, checked by `python -m unstep_export selftest`.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def selftest() -> None:
    for ctr, key, want in KAT:
        got = philox4x32_10(np.array([ctr[0]]), ctr[1], ctr[2], ctr[3], key[0], key[1])
        got = tuple(int(x[0]) for x in got)
        assert got == want, f"philox KAT failed: {[hex(x) for x in got]} != {[hex(x) for x in want]}"
