"""The clean-room GPEN generator, its configurations and loading."""

from gpen_tune.model.configs import MODELS, GPENConfig, ModelInfo, model_info
from gpen_tune.model.gpen import FullGenerator, Generator

__all__ = ["MODELS", "FullGenerator", "GPENConfig", "Generator", "ModelInfo", "model_info"]
