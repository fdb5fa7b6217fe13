"""Batch sizes for the GPU stage: the CUDA-graph buckets of the tune part, and how many faces to take now.

Batches are always a bucket size (1, 2, 4, ... 64) so a CUDA-graph restorer replays a captured graph without
padding; a leftover of 29 faces runs as 16 + 8 + 4 + 1. `limit` is the largest batch the device has taken
without running out of memory (lowered by the OOM split, never raised again in a run).
"""

from __future__ import annotations

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


def bucket_floor(n: int, limit: int = BUCKETS[-1]) -> int:
    """Largest bucket <= min(n, limit); 0 when n == 0."""
    if n <= 0:
        return 0
    cap = min(n, max(1, limit))
    return max(b for b in BUCKETS if b <= cap)


def bucket_ceil(n: int) -> int:
    """Smallest bucket >= n (the last bucket for larger n)."""
    for b in BUCKETS:
        if b >= n:
            return b
    return BUCKETS[-1]


def split_sizes(n: int, limit: int = BUCKETS[-1]) -> list[int]:
    """How n faces are cut into bucket-sized batches no larger than `limit`, largest first."""
    sizes = []
    while n > 0:
        b = bucket_floor(n, limit)
        sizes.append(b)
        n -= b
    return sizes
