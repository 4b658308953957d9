"""yarnlib: one definition of the scaled rotary embedding (PI, NTK, Dynamic NTK, NTK-by-parts,
YaRN, Dynamic-YaRN) for transformers, vLLM, config files and evaluations."""

from yarnlib.spec import ALIASES, METHODS, RopeScaling

__version__ = "0.1.0"
__all__ = ["ALIASES", "METHODS", "RopeScaling", "__version__"]
