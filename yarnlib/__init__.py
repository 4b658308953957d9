"""yarnlib: one definition of the scaled rotary embedding (PI, NTK, Dynamic NTK, NTK-by-parts,
YaRN, Dynamic-YaRN) for transformers, vLLM, config files and evaluations."""

from yarnlib.patches import SUPPORTED, declare_length, patch, register_hf, unpatch
from yarnlib.pose import pose_position_ids
from yarnlib.spec import ALIASES, METHODS, RopeScaling

__version__ = "0.1.0"
__all__ = [
    "ALIASES",
    "METHODS",
    "SUPPORTED",
    "RopeScaling",
    "__version__",
    "declare_length",
    "patch",
    "pose_position_ids",
    "register_hf",
    "unpatch",
]

# Configs that yarnlib wrote for methods transformers lacks load after `import yarnlib`.
register_hf()
