"""The fast path (`--preset speed`): `fuse(model, dtype)` rebuilds a loaded FullGenerator's forward with fused
passes, channels-last layout and precomputed weight transforms; same function, same forward contract.

`reference_forward` is the upstream (per-sample grouped conv) formulation used as the fidelity reference.
"""

from gpen_tune.fast.fused import FastOptions, FusedGenerator, fuse
from gpen_tune.fast.reference import ReferenceGenerator, reference_forward

__all__ = ["FastOptions", "FusedGenerator", "ReferenceGenerator", "fuse", "reference_forward"]
