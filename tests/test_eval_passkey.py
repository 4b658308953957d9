import re

import pytest
from test_eval_support import tiny_tokenizer
from tiny_models import tiny_model

from yarnlib.eval import passkey
from yarnlib.eval.methods import parse_methods
from yarnlib.eval.passkey import build_prompt, min_length, parse_answer
from yarnlib.eval.store import CellStore


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("length", [600, 2000, 5000])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_prompt_length_and_key_depth(tok, length, depth):
    prompt = build_prompt(tok, length, depth, seed=f"t:{length}:{depth}")
    assert abs(len(prompt.input_ids) - length) <= 0.01 * length
    # depth is measured through the filler: 0 right after the instructions, 1 before the question
    placed = (prompt.key_start - prompt.header_tokens) / prompt.filler_tokens
    assert abs(placed - depth) <= 0.01
    text = tok.decode(prompt.input_ids)
    assert f"The pass key is {prompt.key}." in text
    assert text.endswith("What is the pass key? The pass key is")
    key_text = tok.decode(prompt.input_ids[prompt.key_start :])
    assert key_text.lstrip("\n").startswith(f"The pass key is {prompt.key}")


def test_prompts_are_seeded_and_distractors_differ(tok):
    a = build_prompt(tok, 1500, 0.5, seed=3, distractors=3)
    assert a.input_ids == build_prompt(tok, 1500, 0.5, seed=3, distractors=3).input_ids
    assert a.input_ids != build_prompt(tok, 1500, 0.5, seed=4, distractors=3).input_ids
    text = tok.decode(a.input_ids)
    assert len(a.input_ids) == 1500
    keys = re.findall(r"The (\w+) key is (\d+)\.", text)
    assert len(keys) == 4 and keys.count(("pass", str(a.key))) == 1
    assert len({k for _, k in keys}) == 4  # the decoys are other numbers


def test_too_short_and_bad_depth(tok):
    shortest = min_length(tok)
    build_prompt(tok, shortest, 0.5, seed=0)
    with pytest.raises(ValueError, match="length must be >="):
        build_prompt(tok, shortest - 1, 0.5, seed=0)
    with pytest.raises(ValueError, match="depth"):
        build_prompt(tok, 1000, 1.5, seed=0)


@pytest.mark.parametrize(
    "text,expected",
    [
        (" 12345.", 12345),
        ("12345", 12345),
        (" 12,345 is it", 12345),
        ("\n\nThe pass key is 54321. Remember", 54321),
        (" 1 2 3 4 5", 12345),
        ("  is  67890</s>", 67890),
        (" not given.", None),
        ("", None),
    ],
)
def test_parse_answer(text, expected):
    assert parse_answer(text) == expected


def test_scoring_counts_the_pass_key_only(tok, tmp_path, monkeypatch):
    """A random model never answers right, so the replies are chosen here: the pass key, a
    decoy's key (distractor prompts), another number, no number. Accuracy per cell must be
    the share of replies that are the pass key."""
    replies = iter(["key", "decoy", "other", "none", "key", "key", "decoy", "key"])

    def reply(model, tokenizer, prompt, max_new_tokens):
        keys = re.findall(r"The (\w+) key is (\d+)\.", tokenizer.decode(prompt.input_ids))
        decoys = [int(k) for name, k in keys if name != "pass"]
        assert len(decoys) == 2 and prompt.key not in decoys
        kind = next(replies)
        return {"key": f" {prompt.key}.", "decoy": f" {decoys[0]}.", "other": " 7.",
                "none": " not given."}[kind]  # fmt: skip

    monkeypatch.setattr(passkey, "answer", reply)
    store = CellStore(tmp_path, ("method", "length", "depth"), {}, resume=False)
    methods = parse_methods("none")
    passkey.run_passkey(tiny_model(), tok, methods, [400], [0.2, 0.8], 4, store, distractors=2)
    first, second = store.done[("none", 400, 0.2)], store.done[("none", 400, 0.8)]
    assert (first["correct"], first["accuracy"]) == (1, 0.25)
    assert (second["correct"], second["accuracy"]) == (3, 0.75)
    for cell in (first, second):
        right = [a["answer"] == a["key"] for a in cell["answers"]]
        assert cell["accuracy"] == sum(right) / len(right) and cell["distractors"] == 2
    assert [a["answer"] for a in first["answers"]][2:] == [7, None]
