"""Batch sizes: the one bucket table, the default batch size, and how many pending faces to launch.

Batches of an eager forward are bucket sizes (1, 2, 4, ... 64); a leftover of 29 faces runs as 16 + 8 + 4 + 1. A
forward that pads every batch to one shape (torch.compile: one compile per shape; CUDA graphs: one warm-up and
capture per shape) instead takes up to the limit at once.
"""

from __future__ import annotations

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


# --act-checkpoint (as in --preset low-memory) on a GPU: one face per call. GPEN-BFR-512 in bf16 under a 4 GiB cap:
# one call's peak above the weights 227 MiB at batch 1, 583 MiB at batch 2 (benchmarks/results/
# 20261202-005540_low_memory_low-memory_bs1.json, -005523_...json: generator_call_peak_mib); with 164 MiB of
# weights, batch 2 alone leaves nothing of the 700 MiB budget for the detector and the paste.
LOW_MEMORY_BATCH = 1


def default_batch_size(device, low_memory: bool = False) -> int:
    """Faces per generator call unless the user says otherwise.

    CUDA: 32 (a bucket; GPEN-512 bs32 fits a few GiB in half precision and the restorer splits on OOM), or
    LOW_MEMORY_BATCH with `low_memory` (--act-checkpoint, as in --preset low-memory: sized for a 4 GiB GPU's 700 MiB
    peak budget with GPEN-512 in bf16; benchmarks/low_memory.py measures it). CPU: 1: a bigger batch is not
    faster per face on a CPU (the convolutions already fill the cores at batch 1) and every face of a batch adds
    its activations to the resident memory (GPEN-512 fp32 batch 8: > 4 GB). Elsewhere (MPS) 8."""
    kind = getattr(device, "type", None) or str(device)
    if kind.startswith("cuda"):
        return LOW_MEMORY_BATCH if low_memory else 32
    if kind == "cpu":
        return 1
    return LOW_MEMORY_BATCH if low_memory else 8


def bucket_floor(n: int, limit: int = BUCKETS[-1]) -> int:
    """Largest bucket <= min(n, limit); 0 when n == 0."""
    if n <= 0:
        return 0
    cap = min(n, max(1, limit))
    return max(b for b in BUCKETS if b <= cap)


def sizes_up_to(limit: int) -> tuple[int, ...]:
    """The batch sizes a forward that pads to buckets runs at (Restorer.padded_size): the buckets below `limit`,
    then `limit` itself."""
    return tuple(b for b in BUCKETS if b < limit) + (int(limit),)


def bucket_ceil(n: int) -> int:
    """Smallest bucket >= n; n above the largest bucket is an error (the caller splits first)."""
    for b in BUCKETS:
        if b >= n:
            return b
    raise ValueError(f"batch {n} is above the largest bucket {BUCKETS[-1]}")


def split_sizes(n: int, limit: int = BUCKETS[-1]) -> list[int]:
    """How n faces are cut into bucket-sized batches no larger than `limit`, largest first."""
    sizes = []
    while n > 0:
        b = bucket_floor(n, limit)
        sizes.append(b)
        n -= b
    return sizes


def take(n: int, limit: int, one_shape: bool = False) -> int:
    """How many of n pending faces to launch now: a bucket size <= limit, or up to `limit` for a forward that pads
    every batch to one shape (the padding costs less than a compile per bucket)."""
    return min(n, limit) if one_shape else bucket_floor(n, limit)
