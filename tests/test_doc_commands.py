"""Every yarnlib command in README.md and docs/*.md is accepted by yarnlib's own parser
(issue 53): an unknown flag, a removed option or a wrong subcommand in the docs fails here,
named by file:line. ``benchmarks/doc_commands.py --run`` runs them for real (not in CI)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import doc_commands  # noqa: E402

SAMPLE = """\
Intro.

```bash
M=./models/Qwen3-8B   # a variable the block uses
yarnlib plan $M --prompt 16384 \\
    --response 114688 --gpus 8 --gpu-memory 80GiB   # a comment
python -m yarnlib inspect --method yarn --factor 4   # the same program
# yarnlib tune --commented-out
accelerate launch --config_file examples/finetune/single_gpu.yaml -m yarnlib.finetune \\
  --model PATH --method yarn --factor 16 --dataset texts/ --seq-len 4096 --steps 9 --output runs/x
vllm serve Qwen3-8B-128k
```

```console
$ yarnlib config DIR --check; echo $?
1
$ yarnlib eval passkey --model PATH --lengths 16384 \\
    --bogus-flag 3 [--trials 5]
passkey accuracy per length
```

```python
yarnlib = "not a shell block"
```
"""


def sample_commands(tmp_path: Path) -> list[doc_commands.Command]:
    doc = tmp_path / "sample.md"
    doc.write_text(SAMPLE)
    return doc_commands.commands_of(doc)


def test_extraction_joins_continuations_drops_prompts_comments_and_output(tmp_path):
    found = sample_commands(tmp_path)
    assert [c.where for c in found] == [f"sample.md:{n}" for n in (5, 7, 9, 15, 17)]
    plan, inspect, finetune, check, passkey = found
    assert plan.argv == ["plan", "./models/Qwen3-8B", "--prompt", "16384", "--response",
                         "114688", "--gpus", "8", "--gpu-memory", "80GiB"]  # fmt: skip
    assert (inspect.kind, inspect.argv[:1]) == ("yarnlib", ["inspect"])
    assert finetune.kind == "finetune" and finetune.argv[:2] == ["--model", "PATH"]
    assert finetune.launcher[:2] == ["accelerate", "launch"]
    assert (check.argv, check.expected_exit, check.output) == (["config", "DIR", "--check"], 1, [])
    assert passkey.argv[-3:] == ["3", "--trials", "5"]  # [--trials 5]: an optional part, tried
    assert passkey.output == ["passkey accuracy per length"]


def test_parse_check_names_an_unknown_flag_and_accepts_placeholders(tmp_path):
    errors = {c.where: doc_commands.parse_error(c) for c in sample_commands(tmp_path)}
    assert "--bogus-flag" in errors.pop("sample.md:17")
    assert errors == dict.fromkeys(errors)  # PATH, DIR, $M: placeholders the parser takes


def test_every_doc_command_is_accepted_by_the_parser():
    commands = doc_commands.all_commands()
    assert len(commands) > 40  # the extractor still finds the docs' commands
    broken = [
        f"{c.where}: {c.text}\n    {e}" for c in commands if (e := doc_commands.parse_error(c))
    ]
    assert not broken, "doc commands yarnlib rejects:\n" + "\n".join(broken)


def test_every_benchmark_script_is_in_the_index():
    # benchmarks/README.md opens with one index of the scripts by purpose; a new script that is
    # not in it, or a listed one that is gone, fails here
    readme = (REPO / "benchmarks" / "README.md").read_text()
    index = readme.split("\n## ")[0]
    names = (word.strip("`(),") for word in index.split())
    listed = {name for name in names if name.endswith((".py", ".sh"))}
    scripts = {p.name for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts == listed
