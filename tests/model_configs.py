"""Generator configs the tests share (not a conftest.py: the test modules import from here)."""

from __future__ import annotations

from gpen_tune.model.configs import GPENConfig

# The fewest levels (4, 8, 16 px) with every layer kind of GPEN-BFR-256 (encoder, mapping, styled convs with
# upsampling, ToRGB skips), 32 channels: for what does not depend on size (fallbacks, dtypes, compile graphs), and
# cheap where half precision runs emulated on the CPU.
SMALLEST = GPENConfig(16, narrow=1 / 16)
