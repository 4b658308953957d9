"""Shared helpers of the eval tests (no tests here): a tiny model folder with a real tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

from tiny_models import tiny_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from yarnlib.eval import passkey

VOCAB = 320  # 256 byte symbols + merges: every text encodes and decodes exactly
WORDS = "the king queen lord crown sword night day love death blood rose hath thou art".split()


def corpus_text(words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(words // 10):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(10)) + ".")
    return "\n".join(lines)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [corpus_text(2000), passkey.TASK, passkey.FILLER * 3, passkey.QUESTION]
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def tiny_folder(path: Path, arch: str = "llama", **overrides) -> Path:
    """A saved tiny model (original context 256) plus tokenizer, loadable by folder name."""
    model = tiny_model(arch, vocab_size=VOCAB, **overrides)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def text_dataset(path: Path, sizes: dict[str, int]) -> Path:
    """A folder of .txt documents, ``{name: words}``."""
    path.mkdir(parents=True, exist_ok=True)
    for i, (name, words) in enumerate(sizes.items()):
        (path / f"{name}.txt").write_text(corpus_text(words, seed=i))
    return path
