"""Shared pytest set-up: the tests directory is importable (reference implementations live there), threads bounded."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
