"""GRPO recipes: the same RoPE in the trainer's actor (transformers) and its vLLM rollout.

``verl.apply(cfg, spec, output=DIR)`` and ``easyr1.apply(cfg, spec, output=DIR)`` take the
framework's config (a dict, or a YAML path), write the scaled model folder both the actor and
the rollout load, and return a new dict; neither framework needs to be installed.
"""
