"""Independent passkey draws at the edge of the haystack's size (issue 52, mutation round 4)."""

import pytest
from test_eval_support import corpus_text, tiny_tokenizer

from yarnlib.eval.passkey import Independent


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("seed", range(5))
def test_a_haystack_of_exactly_one_token_per_trial_gives_every_trial_its_own_offset(tok, seed):
    """Offsets are drawn without replacement wherever the haystack has as many tokens as there
    are trials: 9 trials over a 9-token haystack start at each of its 9 tokens once (drawn with
    replacement, all 9 would differ with probability 9!/9^9 < 0.001)."""
    haystack = tok(corpus_text(100), add_special_tokens=False)["input_ids"][:9]
    offsets = [offset for _, offset, _ in Independent(haystack).draws(tok, 700, 9, seed)]
    assert sorted(offsets) == list(range(9))
