"""Tiny model folders and data for the fine-tuning tests: a character-level tokenizer and a
learnable synthetic task (cyclic letter runs)."""

from __future__ import annotations

import random
from pathlib import Path

from tiny_models import tiny_model
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

ALPHABET = "abcdefghijklmnopqrstuvwxyz \n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(ALPHABET)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")


def model_dir(folder: Path, arch: str = "llama", **overrides) -> Path:
    """A saved tiny model (vocab 128, L=256) with the character tokenizer beside it."""
    folder = Path(folder)
    tiny_model(arch, attn_implementation="sdpa", **overrides).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def cyclic_texts(count: int, seed: int = 0) -> list[str]:
    """Documents of 20–80 letters continuing the alphabet cyclically from a random letter."""
    rng = random.Random(seed)
    letters = ALPHABET[:26]
    texts = []
    for _ in range(count):
        start, length = rng.randrange(26), rng.randrange(20, 80)
        texts.append("".join(letters[(start + i) % 26] for i in range(length)))
    return texts


def text_folder(folder: Path, texts: list[str]) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (folder / f"doc{i:04d}.txt").write_text(text)
    return folder
