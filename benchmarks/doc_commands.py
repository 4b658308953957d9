"""Every yarnlib command in README.md and docs/*.md, as a newcomer would copy it (issue 53).

    python benchmarks/doc_commands.py --parse   # each is accepted by yarnlib's own parser
    python benchmarks/doc_commands.py --run     # each runs, on tiny models with small lengths

Commands come from fenced shell blocks (``bash``, ``console``, unlabelled, ``text``):
``yarnlib …``, ``python -m yarnlib …`` and ``accelerate launch … -m yarnlib.finetune …``,
with ``\\`` continuations joined, ``$ `` prompts and trailing ``# comments`` removed, output
lines of console blocks kept as what the command should print, ``[--flag value]`` taken as
an optional part that is tried, and ``NAME=value`` lines of the block expanded.

``--run`` runs each file's commands in order in one fresh folder (so a later command finds
what an earlier one wrote), where every model the docs name (``path/to/model``, ``PATH``,
``Qwen3-8B``, ``smollm2`` …) is a tiny random model folder (original context 256, head_dim 32
for vLLM) and every length is scaled by 256 / the named model's own context (Qwen 32768 → 256,
SmolLM2 8192 → 256: ``--lengths 8192,32768`` becomes ``64,256`` for Qwen and ``256,1024`` for
SmolLM2), keeping ratios. Results: ``benchmarks/results/doc_commands/results.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "doc_commands"
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "text"}
FENCE = re.compile(r"^\s*```\s*([\w-]*)")
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.S)


@dataclass
class Command:
    """One yarnlib invocation as a doc writes it."""

    where: str  # file:line of its first line
    text: str  # as written, continuations joined, comments dropped
    kind: str  # "yarnlib" (the yarnlib parser) or "finetune" (-m yarnlib.finetune)
    argv: list[str]  # the program's own arguments
    launcher: list[str]  # what runs the program: accelerate launch …, when not yarnlib itself
    env: dict[str, str] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)  # what a console block shows it printing
    expected_exit: int = 0


# ---------------------------------------------------------------- extraction


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def shell_blocks(path: Path):
    """(language, [(line number, text)]) of each fenced block."""
    lang, lines = None, []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(text)
        if fence and lang is None:
            lang, lines = fence.group(1).lower(), []
        elif text.strip().startswith("```") and lang is not None:
            if lang in SHELL_BLOCKS:
                yield lang, lines
            lang = None
        elif lang is not None:
            lines.append((number, text))


def is_synopsis(lang: str, lines: list[tuple[int, str]]) -> bool:
    """A usage grammar (``[--flag V]``, ``(--a | --b)``, indented continuations without
    ``\\``), not a command to copy."""
    return lang == "" and any("(--" in text or re.match(r"\s+[\[(]", text) for _, text in lines)


def statements(lang: str, lines: list[tuple[int, str]]):
    """[line, joined text, output lines] of each shell statement of a block."""
    console = lang == "console" or any(text.startswith("$ ") for _, text in lines)
    synopsis = is_synopsis(lang, lines)
    found, pending = [], None
    for number, text in lines:
        if synopsis and found and text[:1].isspace():  # the usage goes on
            found[-1][1] += " " + text.strip()
            continue
        if pending is None:
            if console and not text.startswith("$ "):
                if found:  # output of the last command
                    found[-1][2].append(text)
                continue
            pending = [number, [], []]
            text = text[2:] if console else text
        pending[1].append(text.rstrip())
        if not text.rstrip().endswith("\\"):
            found.append([pending[0], " ".join(p.rstrip("\\") for p in pending[1]), []])
            pending = None
    return found


def words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    return list(lexer)


def segments(tokens: list[str]):
    """The simple commands of a statement: split at ; && || |."""
    segment = []
    for token in tokens:
        if token and set(token) <= set(";&|"):
            yield segment
            segment = []
        else:
            segment.append(token)
    yield segment


def optional_parts(tokens: list[str]) -> list[str]:
    """``[--tolerance 1e-3]`` is an optional part of the usage: tried, without its brackets."""
    out, inside = [], False
    for token in tokens:
        if token.startswith("[-"):
            inside, token = True, token[1:]
        if inside and token.endswith("]"):
            inside, token = False, token[:-1]
        out.append(token)
    return out


def invocation(segment: list[str]):
    """(kind, argv, launcher, env) of a yarnlib command, or None."""
    env = {}
    while segment and ASSIGNMENT.match(segment[0]):
        name, value = ASSIGNMENT.match(segment[0]).groups()
        env[name], segment = value, segment[1:]
    if segment[:1] == ["yarnlib"]:
        return "yarnlib", segment[1:], [], env
    for i in range(len(segment) - 1):
        if segment[i] == "-m" and segment[i + 1] in ("yarnlib", "yarnlib.finetune"):
            kind = "yarnlib" if segment[i + 1] == "yarnlib" else "finetune"
            return kind, segment[i + 2 :], segment[: i + 2], env
    return None


def expected_exit(following: list[list[str]], output: list[str]) -> tuple[int, list[str]]:
    """What the doc says the command exits with: ``; echo $?`` then the number, or an
    ``exit N`` output line; 0 otherwise. Returns it and the output lines left."""
    if any(seg[:2] == ["echo", "$?"] for seg in following) and output and output[0].isdigit():
        return int(output[0]), output[1:]
    for line in output:
        if re.fullmatch(r"exit \d+", line.strip()):
            return int(line.split()[1]), [x for x in output if x is not line]
    return 0, output


def synopsis_command(where: str, text: str) -> Command | None:
    """A usage line as a command: the subcommand words, then every option it names."""
    if not text.startswith("yarnlib "):
        return None
    words_ = text.split()
    head = [w for w in words_[1:3] if re.fullmatch(r"[a-z][a-z-]*", w)]
    flags = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", text)))
    return Command(where, text, "synopsis", [*head, *flags], [])


def commands_of(path: Path) -> list[Command]:
    found = []
    name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    for lang, lines in shell_blocks(path):
        variables = {}
        for number, text, output in statements(lang, lines):
            if is_synopsis(lang, lines):
                found += filter(None, [synopsis_command(f"{name}:{number}", text)])
                continue
            for var, value in variables.items():
                text = re.sub(rf"\$\{{?{var}\b}}?", value, text)
            tokens = words(text)
            if len(tokens) == 1 and ASSIGNMENT.match(tokens[0]):
                variables.update([ASSIGNMENT.match(tokens[0]).groups()])
                continue
            parts = list(segments(tokens))
            for i, segment in enumerate(parts):
                spec = invocation(segment)
                if spec is None:
                    continue
                kind, argv, launcher, env = spec
                code, shown = expected_exit(parts[i + 1 :], output)
                written = shlex.join(segment)
                found.append(
                    Command(
                        f"{name}:{number}",
                        written,
                        kind,
                        optional_parts(argv),
                        launcher,
                        env,
                        shown,
                        code,
                    )
                )
    return found


def all_commands() -> list[Command]:
    return [command for path in doc_files() for command in commands_of(path)]


# ---------------------------------------------------------------- --parse


def parse_error(command: Command) -> str | None:
    """None when yarnlib's own parser accepts the command; else its error line."""
    from yarnlib import model_arg
    from yarnlib.cli import build_parser
    from yarnlib.finetune.cli import parse_args

    if command.kind == "synopsis":
        return unknown_options(command)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            if command.kind == "finetune":
                parse_args(command.argv)
            else:
                model_arg.check_model_given(build_parser().parse_args(command.argv))
    except SystemExit as stop:
        error = errors.getvalue().strip().splitlines()[-1] if stop.code else None
        if error and not PLACEHOLDER_VALUE.search(error):
            return error
    return missing_repo_file(command)


# `--factor F`: a typed option given a placeholder; the option exists, the reader fills it in
PLACEHOLDER_VALUE = re.compile(r"invalid \w+ value: '[A-Z][A-Z_]*'$")


def subcommand_parser(words_: list[str]) -> argparse.ArgumentParser:
    from yarnlib.cli import build_parser

    parser = build_parser()
    for word in words_:
        choices = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not choices or word not in choices[0].choices:
            break
        parser = choices[0].choices[word]
    return parser


def unknown_options(command: Command) -> str | None:
    flags = [w for w in command.argv if w.startswith("--")]
    known = subcommand_parser(command.argv)._option_string_actions
    unknown = [flag for flag in flags if flag not in known]
    return f"unknown options in the usage: {' '.join(unknown)}" if unknown else None


def missing_repo_file(command: Command) -> str | None:
    """A file of this repository the command names (a play, an accelerate config) must exist."""
    for token in command.launcher + command.argv:
        if token.startswith(("yarnlib/data/", "examples/")) and not (REPO / token).exists():
            return f"no such file in the repository: {token}"
    return None


# ---------------------------------------------------------------- --run: the stand-ins

# model name as the docs write it -> (architecture, the real model's original context);
# a stand-in's config: original 256, so lengths scale by 256 / that context
GENERIC = ("path/to/model", "PATH", "MODEL_DIR", "MODEL", "smollm2", "smollm2-135m-instruct")
MODELS = {
    **dict.fromkeys(GENERIC, ("llama", 8192)),  # the docs' lengths for these are SmolLM2's
    **dict.fromkeys(("Qwen2.5-7B-Instruct", "models/Qwen2.5-7B-Instruct"), ("qwen2", 32768)),
    **dict.fromkeys(("Qwen3-8B", "models/Qwen3-8B", "Qwen3-8B-by-hand"), ("qwen3", 32768)),
    "meta-llama/Llama-2-7b-hf": ("llama", 4096),
    "tiny-llama": ("llama", 256),  # docs/vllm.md's own tiny model: lengths as written
}
TINY_CONTEXT = 256
# the shortest length a task's prompt fits in, with the stand-ins' byte-level tokenizer:
# ruler refuses < 256; a passkey prompt with 3 distractors takes 356 tokens
SHORTEST = {("eval", "ruler"): 256, ("eval", "passkey"): 512}
# Qwen3-8B's config says 40960 over its original 32768; the by-hand folder of docs/config.md
# has YaRN ×4 written in but max_position_embeddings left at 40960
CONTEXT_OVER_ORIGINAL = {"Qwen3-8B": 1.25, "models/Qwen3-8B": 1.25, "Qwen3-8B-by-hand": 1.25}
HAND_WRITTEN_YARN = {"Qwen3-8B-by-hand"}
LENGTH_FLAGS = {
    "--lengths", "--length", "--target-length", "--seq-len", "--context", "--prompt",
    "--response", "--max-model-len", "--original-max-position-embeddings", "--proxy-length",
}  # fmt: skip
# work flags kept small: a smoke run, not the measurement
CAPS = {"--steps": 2, "--trials": 3, "--samples": 1, "--budget": 4, "--grad-accum": 2,
        "--confirm": 1, "--batch-size": 1}  # fmt: skip
# the same where the doc leaves the work at its default (perplexity: 4 documents, passkey: 30)
ADDED_CAPS = {"perplexity": ["--samples", "1"], "ruler": ["--samples", "1"],
              "passkey": ["--trials", "3"], "tune": ["--samples", "1"]}  # fmt: skip
DATA_FLAGS = {"--dataset", "--held-out", "--haystack"}
KEYWORD_DATA = {"classic", "plays"}  # --haystack names, not paths
TEXT_PLAYS = ("tempest.txt", "henry_v.txt")
TEXT_CHARS = 20000  # each document of a stand-in text folder: a few thousand tokens


def model_name(token: str) -> str:
    return token.removeprefix("~/.cache/yarnlib/").removeprefix("./")


def tiny_model_folder(cache: Path, name: str) -> Path:
    """The stand-in for ``name`` (built once per run, then copied)."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_eval_support import tiny_folder
    from tiny_models import hand_written_rope

    built = cache / name.replace("/", "__")
    if not built.exists():
        arch, _ = MODELS[name]
        context = int(TINY_CONTEXT * CONTEXT_OVER_ORIGINAL.get(name, 1))
        rope = {}
        if name in HAND_WRITTEN_YARN:
            rope = hand_written_rope(
                {
                    "rope_type": "yarn",
                    "rope_theta": 50000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": TINY_CONTEXT,
                }  # fmt: skip
            )
        tiny_folder(built, arch, head_dim=32, max_position_embeddings=context, **rope)
    return built


def text_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for play in TEXT_PLAYS:
        text = (REPO / "yarnlib" / "data" / "shakespeare" / play).read_text()
        (path / play).write_text(text[:TEXT_CHARS])
    return path


@dataclass
class Stage:
    """One doc file's folder: its stand-ins and what its commands wrote."""

    work: Path
    cache: Path

    def model(self, token: str) -> tuple[str, int]:
        """The token as the command should give it, and the real model's original context."""
        name = model_name(token)
        if name not in MODELS:
            return token, 0
        folder = self.work / name
        if not folder.exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(tiny_model_folder(self.cache, name), folder)
        # `smollm2` names the packaged model even beside a folder of that name: ./ is the folder
        given = f"./{name}" if token.startswith("~") or name == "smollm2" else token
        return given, MODELS[name][1]

    def data(self, token: str) -> str:
        if token in KEYWORD_DATA or (self.work / token).exists():
            return token
        if token.endswith("/"):  # a folder of the reader's texts
            text_folder(self.work / token)
            return token
        return str(text_folder(self.work / "texts")) + "/"  # a hub dataset: offline here


# ---------------------------------------------------------------- --run: substitution


def scale_number(value: str, scale: float) -> str:
    """A length off a round one stays off it, on the same side: 16400 (16384 + 16) → 513 when
    16384 → 512, 32767 → 1023 when 32768 → 1024, so < and > between lengths hold."""
    if not value.isdigit():
        return value
    exact = int(value) * scale
    near = round(exact)
    return str(max(1, near + (exact > near) - (exact < near)))


def scale_list(value: str, scale: float) -> str:
    return ",".join(scale_number(v, scale) for v in value.split(","))


def scale_metadata(value: str, scale: float) -> str:
    try:
        metadata = json.loads(value)
    except json.JSONDecodeError:
        return value
    if isinstance(metadata, dict) and "max_seq_lengths" in metadata:
        metadata["max_seq_lengths"] = [
            max(1, math.ceil(n * scale)) for n in metadata["max_seq_lengths"]
        ]
    return json.dumps(metadata)


def model_tokens(command: Command) -> list[int]:
    """Positions in argv of the model: what the parser put in the model field, and lm-eval's
    ``pretrained=``."""
    from yarnlib.cli import build_parser
    from yarnlib.finetune.cli import parse_args

    with contextlib.redirect_stderr(io.StringIO()):
        if command.kind == "finetune":
            args = parse_args(command.argv)
        else:
            args = build_parser().parse_args(command.argv)
    value = getattr(args, getattr(args, "model_field", "") or "-", None)
    return [i for i, token in enumerate(command.argv) if value is not None and token == value]


def substitute(command: Command, stage: Stage) -> list[str]:
    """The command as run here: stand-in models and data, scaled lengths, capped work."""
    argv = list(command.argv)
    original = 0
    for i in model_tokens(command):
        argv[i], original = stage.model(argv[i])
    for i, token in enumerate(argv):
        if token.startswith("pretrained="):
            name, original = stage.model(token.removeprefix("pretrained=").split(",")[0])
            argv[i] = re.sub(r"pretrained=[^,]*", f"pretrained={name}", token)
    scale = TINY_CONTEXT / original if original else 1.0
    floor = SHORTEST.get(tuple(argv[:2]))
    if floor and "--lengths" in argv:  # a prompt's template must fit: the shortest length gets it
        shortest = min(int(n) for n in argv[argv.index("--lengths") + 1].split(","))
        scale = max(scale, floor / shortest)
    added = next((ADDED_CAPS[w] for w in argv[:2] if w in ADDED_CAPS), [])
    if added and added[0] not in argv:
        argv += added
    flag = None
    for i, token in enumerate(argv):
        if token.startswith("-"):
            flag = token
            continue
        if flag in LENGTH_FLAGS:
            argv[i] = scale_list(token, scale)
        elif flag == "--metadata":
            argv[i] = scale_metadata(token, scale)
        elif flag in CAPS and token.isdigit():
            argv[i] = str(min(int(token), CAPS[flag]))
        elif flag in DATA_FLAGS:
            argv[i] = stage.data(token)
    return argv


def skip_reason(command: Command) -> str | None:
    if command.kind == "synopsis":
        return "usage grammar, not a command (its options are checked by --parse)"
    launcher = " ".join(command.launcher)
    if "multi_node" in launcher or "--machine_rank" in launcher:
        return "accelerate multi-node (several machines)"
    if command.argv[:2] == ["eval", "lm-eval"]:
        tasks = command.argv[command.argv.index("--tasks") + 1].split(",")
        remote = [t for t in tasks if not t.startswith("yarnlib_")]
        if remote:
            return f"network: lm-eval downloads {','.join(remote)} from the hub"
    return None


def launcher_here(command: Command) -> tuple[list[str], str]:
    """How to start it on this CPU machine, and a note where that differs from the doc."""
    python = [sys.executable]
    if command.kind == "finetune":
        note = "accelerate's single-GPU config: run as python -m on CPU" if command.launcher else ""
        return [*python, "-m", "yarnlib.finetune"], note
    if command.launcher:
        return [*python, "-m", "yarnlib"], ""
    return [str(Path(sys.executable).parent / "yarnlib")], ""


# ---------------------------------------------------------------- --run: checks


def output_labels(lines: list[str]) -> list[str]:
    """The words that start the doc's output lines (``wrote``, ``consistent``, ``PASS:`` …):
    numbers and names change on a tiny model, the labels must not."""
    labels = []
    for line in lines:
        first = line.split()[0].strip("+-") if line.split() else ""
        if first.startswith(('"', "'")):  # a JSON key: the tiny config has other neighbours
            continue
        match = re.match(r"[A-Za-z][A-Za-z_-]{2,}:?", first)
        if match and match.group(0) not in labels:
            labels.append(match.group(0))
    return labels


def written_paths(argv: list[str]) -> list[str]:
    paths = []
    for flag in ("--output", "--plot", "--json"):
        if flag in argv[:-1] and not argv[argv.index(flag) + 1].startswith("-"):
            paths.append(argv[argv.index(flag) + 1])
    return paths


def files_state(work: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``work`` (not through the repository links): size and mtime."""
    return {
        str(f.relative_to(work)): (f.stat().st_size, f.stat().st_mtime_ns)
        for f in work.rglob("*")
        if f.is_file() and not f.is_symlink() and f.parts[len(work.parts)] not in LINKED
    }


def claims(argv: list[str], before: dict, work: Path) -> list[str]:
    """What the docs promise of config's modes: --dry-run writes nothing, --in-place keeps
    a .bak of config.json, --output symlinks the weights."""
    problems = []
    if "--dry-run" in argv and files_state(work) != before:
        problems.append("--dry-run changed files")
    if argv[:1] == ["config"] and "--in-place" in argv and "--reset" not in argv:
        if not (work / argv[1] / "config.json.bak").exists():
            problems.append("--in-place kept no config.json.bak")
    if argv[:1] == ["config"] and "--output" in argv and "--weights" not in argv:
        weights = list((work / argv[argv.index("--output") + 1]).glob("*.safetensors"))
        if not weights or not all(w.is_symlink() for w in weights):
            problems.append("--output: weights not symlinked")
    return problems


def check(command: Command, argv: list[str], code: int, printed: str, work: Path) -> list[str]:
    problems = []
    if code != command.expected_exit:
        problems.append(f"exit {code}, the doc says {command.expected_exit}")
    missing = [label for label in output_labels(command.output) if label not in printed]
    if missing:
        problems.append("output lacks " + ", ".join(missing))
    if code == 0:
        absent = [p for p in written_paths(argv) if not (work / p).exists()]
        if absent:
            problems.append("not written: " + ", ".join(absent))
    return problems


@dataclass
class Result:
    where: str
    doc: str
    ran: str
    status: str  # ok | fail | skip
    exit: int | None = None
    seconds: float | None = None
    problems: list[str] = field(default_factory=list)
    note: str = ""
    tail: str = ""


LINKED = ("yarnlib", "examples")  # repository folders the docs' paths name

RUN_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}  # fmt: skip


def run_one(command: Command, stage: Stage, timeout: float) -> Result:
    reason = skip_reason(command)
    if reason:
        return Result(command.where, command.text, "", "skip", note=reason)
    argv = substitute(command, stage)
    spec = argv[argv.index("--spec") + 1] if "--spec" in argv[:-1] else None
    if spec and not (stage.work / spec).exists():
        note = f"--spec {spec}: a placeholder no earlier command of the page writes"
        return Result(command.where, command.text, "", "skip", note=note)
    start, note = launcher_here(command)
    env = {**os.environ, **RUN_ENV, **command.env}
    shown = ["yarnlib"] if start[0].endswith("yarnlib") else ["python", *start[1:]]
    ran = shlex.join([*(f"{k}={v}" for k, v in command.env.items()), *shown, *argv])
    before = files_state(stage.work) if "--dry-run" in argv else {}
    began = time.monotonic()
    try:
        done = subprocess.run(
            ["nice", "-n", "10", *start, *argv], cwd=stage.work, env=env, capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip
        code, printed = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stop:
        code, printed = -1, f"timed out after {timeout:.0f} s\n{stop.stdout or ''}"
    seconds = round(time.monotonic() - began, 1)
    problems = check(command, argv, code, printed, stage.work)
    problems += claims(argv, before, stage.work) if code == 0 else []
    status = "fail" if problems else "ok"
    tail = "\n".join(printed.strip().splitlines()[-8:]) if problems else ""
    return Result(command.where, command.text, ran, status, code, seconds, problems, note, tail)


def prepare(work: Path) -> None:
    """The repository paths the docs name (plays, accelerate configs) resolve inside ``work``."""
    work.mkdir(parents=True)
    for name in LINKED:
        (work / name).symlink_to(REPO / name)


def run_all(commands: list[Command], timeout: float, root: Path, keep: bool) -> list[Result]:
    results, stages = [], {}
    cache = root / "models"
    cache.mkdir(parents=True, exist_ok=True)
    for n, command in enumerate(commands, 1):
        doc = command.where.split(":")[0]
        if doc not in stages:
            stages[doc] = Stage(root / doc.replace("/", "__"), cache)
            prepare(stages[doc].work)
        result = run_one(command, stages[doc], timeout)
        results.append(result)
        write_results(merged(results) if keep else results)  # a stopped run leaves its part
        shown = " ".join(result.problems) or result.note
        ran = f"exit={result.exit} {result.seconds}s " if result.status != "skip" else ""
        print(f"[{n}/{len(commands)}] {result.where} {result.status} {ran}{shown}", flush=True)
    return results


# ---------------------------------------------------------------- reports


def markdown(results: list[Result]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "fail", "skip")}
    lines = [
        "# Doc commands run on tiny models",
        "",
        f"`python benchmarks/doc_commands.py --run`: {len(results)} commands, "
        f"{counts['ok']} ok, {counts['fail']} failed, {counts['skip']} skipped.",
        "",
        "| where | status | exit | s | command as run | problems / note |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ran = (r.ran or r.doc).replace("|", "\\|")
        said = r.tail.splitlines()[-1:] if r.status == "fail" else []  # its error line
        why = "; ".join(r.problems + said + ([r.note] if r.note else [])).replace("|", "\\|")
        exit_, seconds = ("", "") if r.status == "skip" else (r.exit, r.seconds)
        lines.append(f"| {r.where} | {r.status} | {exit_} | {seconds} | `{ran}` | {why} |")
    return "\n".join(lines) + "\n"


def merged(results: list[Result]) -> list[Result]:
    """The earlier full run's results with these (an ``--only`` rerun) in their place."""
    saved = RESULTS / "results.json"
    earlier = [Result(**r) for r in json.loads(saved.read_text())] if saved.exists() else []
    fresh = {r.where: r for r in results}
    kept = [fresh.pop(r.where, r) for r in earlier]
    return kept + list(fresh.values())


def write_results(results: list[Result]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    (RESULTS / "results.md").write_text(markdown(results))


def report_parse(commands: list[Command]) -> int:
    broken = [(c, parse_error(c)) for c in commands]
    broken = [(c, e) for c, e in broken if e]
    for command, error in broken:
        print(f"{command.where}: {command.text}\n    {error}")
    print(f"{len(commands)} commands, {len(broken)} rejected")
    return 1 if broken else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--parse", action="store_true", help="check each against the parser")
    mode.add_argument("--run", action="store_true", help="run each on tiny models")
    mode.add_argument("--list", action="store_true", help="print the commands found")
    parser.add_argument(
        "--only",
        default="",
        help="only commands whose file:line contains this; their results "
        "replace theirs in the saved ones",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per command")
    args = parser.parse_args()
    commands = [c for c in all_commands() if args.only in c.where]
    if args.list:
        for command in commands:
            print(f"{command.where}: {command.text}  [exit {command.expected_exit}]")
        return 0
    if args.parse:
        return report_parse(commands)
    with tempfile.TemporaryDirectory(prefix="doc_commands_") as root:
        results = run_all(commands, args.timeout, Path(root), keep=bool(args.only))
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
