"""``yarnlib tune``: the best RoPE scaling for a model and a target length, no fine-tuning."""
