import importlib
import re

import pytest
import torch
from test_eval_support import VOCAB, tiny_tokenizer
from tiny_models import hand_written_rope, tiny_model

import yarnlib
from yarnlib.eval import passkey
from yarnlib.eval.methods import apply_method, parse_methods
from yarnlib.eval.passkey import PromptCache, build_prompt, min_length, parse_answer, prefill
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

    def reply(model, tokenizer, prompt, max_new_tokens, cache):
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


@pytest.fixture(scope="module")
def sdpa_model():
    return tiny_model(vocab_size=VOCAB, attn_implementation="sdpa")


@torch.no_grad()
def generated_logits(model, ids, max_new_tokens=8):
    """The logits ``generate`` picks the first new token from (the whole prompt at once)."""
    out = model.generate(
        input_ids=torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0,
    )  # fmt: skip
    return out.logits[0][0]


@pytest.mark.parametrize("method", ["none", "yarn:4", "ntk:2", "dynamic_yarn:4"])
def test_prefill_from_a_shared_prefix_equals_a_full_forward(tok, sdpa_model, method, monkeypatch):
    """Prompts of several lengths and depths, each after the one before in one cache: the
    logits of the last prompt token equal generate's on the whole prompt (float32: 2e-5), and
    the cache reused exactly each prompt's common prefix with the one before (the filler up to
    the earlier key) where it is long enough, and for dynamic tables only at the same length.
    Small chunks make the suffixes span several forwards."""
    monkeypatch.setattr(passkey, "CHUNK", 64)
    apply_method(sdpa_model, parse_methods(method)[0])
    dynamic = method.startswith("dynamic")
    cache, before, reuses = PromptCache(same_length_only=dynamic), [], []
    for n, d in [(400, 0.1), (600, 0.3), (600, 0.5), (400, 0.9), (600, 0.9), (600, 0.1)]:
        ids = build_prompt(tok, n, d, seed=f"{n}:{d}:{len(before)}").input_ids
        common = next((i for i, (a, b) in enumerate(zip(before, ids, strict=False)) if a != b), 0)
        if common < passkey.MIN_REUSE * n or (dynamic and len(before) != n):
            common = 0
        reused = cache.reused
        with passkey.declared(sdpa_model, n + 8):  # what answer() declares
            got = prefill(sdpa_model, ids, cache)
        want = generated_logits(sdpa_model, ids)
        reuses.append(cache.reused - reused)
        assert reuses[-1] == common
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
        before = ids
    assert reuses == ([0, 0, 238, 0, 0, 157] if dynamic else [0, 0, 238, 301, 301, 157])
    apply_method(sdpa_model, parse_methods("none")[0])


def test_shared_and_full_prompts_give_the_same_cells(tok, sdpa_model, tmp_path):
    """run_passkey with shared prefixes against every prompt in full through ``generate``:
    the same replies in every cell, static and dynamic; a cell's later trials reuse the
    prompt up to its key."""
    methods = parse_methods("yarn:4,dynamic_yarn:4,none")
    cells = {}
    for share in (True, False):
        store = CellStore(tmp_path / str(share), ("method", "length", "depth"), {}, resume=False)
        passkey.run_passkey(
            sdpa_model, tok, methods, [300, 700], [0.6, 0.3], 2, store, share_prefixes=share
        )
        cells[share] = store.done
    assert cells[True].keys() == cells[False].keys() and len(cells[True]) == 12
    for key, shared in cells[True].items():
        full = cells[False][key]
        assert [a["text"] for a in shared["answers"]] == [a["text"] for a in full["answers"]]
        assert full["reused_prompt_tokens"] == 0
        assert shared["reused_prompt_tokens"] >= key[2] * key[1] * 0.9


def test_which_tables_depend_on_the_length(sdpa_model):
    for method, depends in [("none", False), ("yarn:4", False), ("ntk:2", False),
                            ("dynamic_yarn:4", True), ("dynamic_ntk:2", True)]:  # fmt: skip
        apply_method(sdpa_model, parse_methods(method)[0])
        assert passkey.tables_depend_on_length(sdpa_model) is depends, method
    native = yarnlib.RopeScaling.from_hf(sdpa_model.config)
    phi = dict(method="longrope", factor=4.0, original_max_position_embeddings=256)
    checkpoint = native.replace(**phi, short_factor=[1.0] * 8, long_factor=[4.0] * 8)
    applied = checkpoint.replace(short_factor=[4.0] * 8, attention_factor=1.0)
    assert checkpoint.tables_depend_on_length and not applied.tables_depend_on_length
    apply_method(sdpa_model, parse_methods("none")[0])


def test_a_killed_cell_resumes_from_its_last_trial(tok, sdpa_model, tmp_path, monkeypatch):
    """Killed inside a cell, a resumed run computes only the trials missing from the trial
    store and ends with the cells of a run never killed (the first cell whole, the second
    with its one finished trial taken from disk)."""
    keys = ("method", "length", "depth")
    run = (sdpa_model, tok, parse_methods("yarn:4"), [300], [0.6, 0.3], 3)

    def stores(folder, resume):
        cells = CellStore(tmp_path / folder, keys, {}, resume)
        return cells, CellStore(tmp_path / folder, (*keys, "trial"), {}, resume, passkey.TRIALS)

    whole, _ = stores("whole", False)
    passkey.run_passkey(*run, whole)
    real, calls = passkey.answer, []

    def answer(*args, kill_after=None):
        if len(calls) == kill_after:
            raise KeyboardInterrupt
        calls.append(args[2].key)
        return real(*args)

    monkeypatch.setattr(passkey, "answer", lambda *args: answer(*args, kill_after=4))
    cells, trials = stores("killed", False)
    with pytest.raises(KeyboardInterrupt):
        passkey.run_passkey(*run, cells, trial_store=trials)
    assert (len(cells.done), len(trials.done)) == (1, 4)

    calls.clear()
    monkeypatch.setattr(passkey, "answer", answer)
    cells, trials = stores("killed", True)
    passkey.run_passkey(*run, cells, trial_store=trials)
    assert len(calls) == 2 and len(trials.done) == 6
    assert cells.done.keys() == whole.done.keys()
    for key, cell in whole.done.items():
        assert cells.done[key]["answers"] == cell["answers"], key
    assert cells.done[("yarn:4", 300, 0.6)]["resumed_trials"] == 1


def test_a_repeated_prompt_or_its_prefix_reuses_all_but_the_last_token(tok, sdpa_model):
    """The same prompt twice, then a prefix of it: the cache gives all but the last token
    (at least one token is computed, so there are logits), and the logits are a plain full
    forward's."""
    apply_method(sdpa_model, parse_methods("none")[0])
    ids = build_prompt(tok, 400, 0.5, seed="repeat").input_ids
    cache = PromptCache()
    for prompt, reuses in ((ids, 0), (ids, len(ids) - 1), (ids[:300], 299)):
        reused = cache.reused
        got = prefill(sdpa_model, prompt, cache)
        with torch.no_grad():
            want = sdpa_model(input_ids=torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert cache.reused - reused == reuses


def test_the_cached_path_declares_what_generate_declares(tok, sdpa_model, monkeypatch):
    """A dynamic method's scale depends on the declared length: answer() with a cache must
    declare prompt + max_new_tokens as the patched generate() does, and its first logits must
    be generate's (the tiny model's replies would hide a wrong scale)."""
    patch_module = importlib.import_module("yarnlib.patches.patch")  # the package's patch()

    apply_method(sdpa_model, parse_methods("dynamic_yarn:4")[0])
    declared, first_logits = {"answer": [], "generate": []}, []

    def spy(real, into):
        def declare(model, length):
            declared[into].append(length)
            return real(model, length)

        return declare

    monkeypatch.setattr(passkey, "declare_length", spy(passkey.declare_length, "answer"))
    monkeypatch.setattr(
        patch_module, "declare_length", spy(patch_module.declare_length, "generate")
    )
    real_prefill = passkey.prefill
    monkeypatch.setattr(
        passkey, "prefill", lambda *a: first_logits.append(real_prefill(*a)) or first_logits[-1]
    )
    prompt = build_prompt(tok, 400, 0.5, seed="declared")
    passkey.answer(sdpa_model, tok, prompt, max_new_tokens=8, cache=PromptCache(True))
    want = generated_logits(sdpa_model, prompt.input_ids, max_new_tokens=8)
    assert declared == {"answer": [408], "generate": [408]}
    torch.testing.assert_close(first_logits[0], want, rtol=0, atol=2e-5)
    apply_method(sdpa_model, parse_methods("none")[0])


def test_none_row_records_the_scaling_the_model_was_saved_with(tok, tmp_path, monkeypatch):
    """A fine-tuned model saved with yarn x4 runs scaled under ``none``: its cells say so."""
    monkeypatch.setattr(passkey, "answer", lambda model, tokenizer, prompt, *_: f" {prompt.key}.")
    yarn4 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    saved_scaled = tiny_model(
        **hand_written_rope({**yarn4, "rope_theta": 50000.0}), max_position_embeddings=1024
    )
    for model, expected in [(saved_scaled, ("yarn", 4.0)), (tiny_model(), ("none", 1.0))]:
        store = CellStore(tmp_path / expected[0], ("method", "length", "depth"), {}, resume=False)
        passkey.run_passkey(model, tok, parse_methods("none"), [400], [0.5], 1, store)
        cell = store.done[("none", 400, 0.5)]
        assert (cell["scaling"], cell["factor"]) == expected
