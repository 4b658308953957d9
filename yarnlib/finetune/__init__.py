"""Long-context fine-tuning on accelerate: ``yarnlib finetune`` / ``python -m yarnlib.finetune``."""
