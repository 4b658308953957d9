"""Which model paths of a GRPO recipe name the actor's checkpoint (issue 52, mutation round over
the safe-write code): an actor path given relatively is that folder for a critic that names it
the same way, and another checkpoint exactly as long as a sequence is long enough."""

from __future__ import annotations

import pytest
import yaml
from test_integrations import VERL_YAML, spec
from tiny_models import tiny_model

from yarnlib.integrations import verl


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working folder holding the actor's checkpoint ``tiny`` (context 256), the cwd."""
    tiny_model("llama", head_dim=32).save_pretrained(tmp_path / "tiny")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("critic", ["tiny", "./tiny/", "../{name}/tiny"])
def test_an_actor_path_given_relatively_is_the_critics_checkpoint_too(workdir, critic):
    cfg = yaml.safe_load(VERL_YAML.replace("MODEL", "tiny"))  # relative to the working folder
    cfg["critic"] = {"model": {"path": critic.format(name=workdir.name)}}
    out = verl.apply(cfg, spec(), output=workdir / "scaled")
    assert out["actor_rollout_ref"]["model"]["path"] == str(workdir / "scaled")
    assert out["critic"]["model"]["path"] == str(workdir / "scaled")


def test_another_checkpoint_as_long_as_a_sequence_is_kept(workdir):
    tiny_model("llama", head_dim=32).save_pretrained(workdir / "critic")  # context 256
    cfg = yaml.safe_load(VERL_YAML.replace("MODEL", str(workdir / "tiny")))
    cfg["data"] = {"max_prompt_length": 64, "max_response_length": 192}  # 256 tokens in all
    cfg["critic"] = {"model": {"path": str(workdir / "critic")}}
    out = verl.apply(cfg, spec(), output=workdir / "scaled")
    assert out["critic"]["model"]["path"] == str(workdir / "critic")  # its own, unscaled
    cfg["data"]["max_response_length"] = 193  # one token past its context: refused
    with pytest.raises(ValueError, match=r"critic.model.path: .* context of 256 tokens, below"):
        verl.apply(cfg, spec(), output=workdir / "scaled-again")
