"""vLLM adapter: engine kwargs and serve flags, a plugin for the methods vLLM lacks, a parity check.

Importing this package does not import vLLM; only ``plugin.register`` (run by vLLM) and
``check_rollout`` do.
"""

from yarnlib.vllm.kwargs import PLUGIN_TYPES, llm_kwargs, serve_args

__all__ = ["PLUGIN_TYPES", "llm_kwargs", "serve_args"]
