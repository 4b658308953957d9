"""GRPO recipes: the same RoPE in the trainer's actor (transformers) and its vLLM rollout.

``verl.apply(cfg, spec)`` and ``easyr1.apply(cfg, spec, ...)`` take the framework's config
(a dict, or a YAML path) and return a new dict; neither framework needs to be installed.
"""
