"""Example models built from code (never downloaded) and the loader for user models.

    from planner.models import get_example, load_model
    ex = get_example("gpt2-xl")                 # on the meta device: shapes only
    ex = load_model("path/to/file.py:factory")  # a user factory returning (model, example_inputs)

Built-in names: "mlp", "gpt-tiny", "gpt2-small", "gpt2-xl", "gpt3-175b", "hf-gpt2" (see `EXAMPLES`).
"""

from planner.models.gpt import GPT, GPT_SIZES, GPTConfig, GPTConfigError, build_gpt, gpt_config
from planner.models.hf_gpt2 import HF_GPT2_DEFAULTS, build_hf_gpt2
from planner.models.loading import EXAMPLES, Example, ModelLoadError, get_example, load_model
from planner.models.mlp import MLP, MLP_DEFAULTS, build_mlp

__all__ = ["EXAMPLES", "Example", "ModelLoadError", "get_example", "load_model", "GPT", "GPTConfig",
           "GPTConfigError", "GPT_SIZES", "build_gpt", "gpt_config", "MLP", "MLP_DEFAULTS", "build_mlp",
           "HF_GPT2_DEFAULTS", "build_hf_gpt2"]
