"""A tune folder written before ``--objective`` existed (issue 52, mutation round 4): its search
minimised the NLL, which neither best.json nor final.json says."""

import json

import pytest
from test_eval_support import text_dataset, tiny_folder
from test_tune import L, tune


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=L)


def as_before_objectives(out) -> dict[str, bytes]:
    """Rewrite best.json and final.json as a search from before --objective wrote them."""
    best = json.loads((out / "best.json").read_text())
    del best["minimised"]
    final = json.loads((out / "final.json").read_text())
    del final["minimised"], final["settings"]["objective"]
    (out / "best.json").write_text(json.dumps(best))
    (out / "final.json").write_text(json.dumps(final))
    return {name: (out / name).read_bytes() for name in ("best.json", "final.json", "trials.jsonl")}


def test_an_nll_search_from_before_objectives_continues_and_refuses_another(
    model_dir, tmp_path, capsys
):
    """Another objective in that folder is refused in one line naming final.json and the nll
    search it holds, the files left as they were; the default objective continues it, reusing
    its trials."""
    data = text_dataset(tmp_path / "data", {"a": 1500})
    out = tmp_path / "out"
    assert tune(model_dir, data, out, 2, "--space", "yarn") == 0
    kept = as_before_objectives(out)
    capsys.readouterr()
    needle = ["--objective", "needle", "--needles", "3"]
    assert tune(model_dir, data, out, 2, "--space", "yarn", *needle) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert f"objective: {out} holds a search minimising nll (final.json)" in err
    assert "this run asks for needle (needles 3); allowed: --objective nll to continue it" in err
    assert {name: (out / name).read_bytes() for name in kept} == kept
    assert tune(model_dir, data, out, 2, "--space", "yarn") == 0
    assert "(0 computed now)" in capsys.readouterr().out
