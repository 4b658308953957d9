"""Rewrite the RoPE settings of a model folder: config.json, tokenizer_config.json and
generation_config.json.

Files are edited as text: only the values that change are re-serialised, so key order,
indentation and every unrelated byte stay as they were. What a rewrite replaced is recorded
in config.json under ``yarnlib_native``, and every rewrite starts from the files restored from
that record: the same command twice gives identical bytes, a new factor re-scales from the
original instead of compounding, and ``reset`` gives back the original bytes.

    spec = target_spec("Qwen2.5-7B-Instruct", method="yarn", factor=4)
    changes = plan("Qwen2.5-7B-Instruct", spec)
    print(diff(changes)); apply("Qwen2.5-7B-Instruct", changes, in_place=True)
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yarnlib.config import file_set
from yarnlib.config.json_text import JsonText, undo
from yarnlib.convert import (
    DEFAULT_ROPE_THETA,
    HF_DYNAMIC_YARN,
    MARKER,
    check_marker,
    from_hf,
    has_rope,
    marked_spec,
    no_rope_message,
    original_lengths,
    rope_parameters_of,
    rotary_dim_of,
    to_hf,
)
from yarnlib.hf_compat import hf_format, rotated_dims, transformers_version
from yarnlib.spec import RopeScaling, canonical_method
from yarnlib.vllm import versions

CONFIG, TOKENIZER, GENERATION = "config.json", "tokenizer_config.json", "generation_config.json"
FILES = (CONFIG, TOKENIZER, GENERATION)
RECORD = "yarnlib_native"  # what each rewritten file held before yarnlib changed it
FORMATS = ("auto", "v4", "v5")
WEIGHTS = ("symlink", "copy")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
# transformers writes int(1e30) as model_max_length for "no limit"
UNLIMITED = 10**18
# vLLM's _get_and_verify_max_len: the smallest of these keys is the derived max_model_len ...
VLLM_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# ... multiplied by rope `factor`, except for these types (their length is already scaled).
VLLM_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


@dataclass(frozen=True)
class Change:
    """One file's text before and after a rewrite."""

    name: str
    before: str
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


# -- reading ------------------------------------------------------------------------------------


TOO_DEEP = "nested too deeply to read (a model config nests a few levels)"


def _parse(path: Path, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: malformed JSON at line {error.lineno}: {error.msg}") from None
    except RecursionError:
        raise ValueError(f"{path}: malformed JSON: {TOO_DEEP}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_files(model_dir: str | Path) -> dict[str, str]:
    """config.json, and tokenizer_config.json / generation_config.json where present, as text."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ValueError(f"model_dir: {str(model_dir)!r} is not a folder")
    file_set.check_complete(folder, "the `yarnlib config ... --in-place` command")
    if not (folder / CONFIG).is_file():
        raise ValueError(f"model_dir: no config.json in {str(model_dir)!r}")
    texts = {}
    for name in FILES:
        path = folder / name
        if path.is_file():
            try:
                texts[name] = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}: not UTF-8 text ({error.reason})") from None
            _parse(path, texts[name])
    config = json.loads(texts[CONFIG])
    if not has_rope(config):
        raise ValueError(f"{folder / CONFIG}: {no_rope_message(config)}")
    return texts


def file_format(config: dict[str, Any]) -> str:
    """'v5' if the file uses rope_parameters, else 'v4' (rope_scaling wins where both are set)."""
    if config.get("rope_scaling") is None and config.get("rope_parameters") is not None:
        return "v5"
    return "v4"


def native_files(texts: dict[str, str]) -> dict[str, str]:
    """The files as they were before yarnlib changed them."""
    config = json.loads(texts[CONFIG])
    record = config.get(RECORD)
    if isinstance(record, dict):
        try:
            native = {name: undo(text, record.get(name, {})) for name, text in texts.items()}
        except (AttributeError, KeyError, TypeError, ValueError):
            raise ValueError(
                f"{CONFIG}: the record {RECORD!r} is damaged; delete the keys {RECORD!r} and "
                f"{MARKER!r} to take the file as it is now"
            ) from None
        doc = JsonText(native[CONFIG])
        doc.remove(RECORD)
        native[CONFIG] = doc.text
        # Undoing and redoing must give the file as it is: otherwise someone edited the keys
        # yarnlib wrote, and restoring the record would throw their edit away.
        spec = from_hf(config)
        current = {k: v for k, v in config.items() if k != RECORD}
        redone = _scale(native, spec, file_format(config), record=False)[CONFIG]
        if json.loads(redone) != current and not _written_unsynced(native, config, current):
            raise ValueError(
                f"{CONFIG}: the RoPE keys were edited after yarnlib wrote them, so the record in "
                f"{RECORD!r} no longer applies; delete the keys {RECORD!r} and {MARKER!r} to take "
                "the file as it is now"
            )
        return native
    if MARKER in config:
        # Written by yarnlib.patch + save_pretrained: no exact record, but the marker gives the
        # unscaled theta and original length.
        spec = from_hf(config)
        unscaled = RopeScaling(
            "none",
            1.0,
            spec.original_max_position_embeddings,
            spec.rope_theta,
            spec.rotary_dim,
        )
        native = dict(texts)
        native[CONFIG] = _scale(texts, unscaled, file_format(config), record=False)[CONFIG]
        doc = JsonText(native[CONFIG])
        doc.remove(MARKER)
        native[CONFIG] = doc.text
        return native
    return dict(texts)


def _written_unsynced(native: dict[str, str], config: dict[str, Any], current: dict) -> bool:
    """Whether an older yarnlib wrote the file: it left a top-level original_max_position_embeddings
    as it was (so transformers 5 ran another L than the one it recorded); redoing its write, with
    the spec it recorded, gives the file as it is, and reset restores the native files."""
    marked = marked_spec(config, from_hf(config).rotary_dim)
    if marked is None or "original_max_position_embeddings" not in config:
        return False
    old = _scale(native, marked, file_format(config), record=False, sync_original=False)
    return json.loads(old[CONFIG]) == current


# -- planning -----------------------------------------------------------------------------------


def current_spec(model_dir: str | Path) -> RopeScaling:
    """The spec the folder runs now (yarnlib's exact one where it wrote the file)."""
    return from_hf(json.loads(read_files(model_dir)[CONFIG]))


def target_spec(
    model_dir: str | Path,
    method: str | None = None,
    factor: float | None = None,
    original_max_position_embeddings: int | None = None,
    **knobs: Any,
) -> RopeScaling:
    """The spec for ``method``/``factor`` on this model: its unscaled rope_theta and rotary dim,
    and its original context unless given (the one recorded in an already scaled config)."""
    texts = read_files(model_dir)
    native_config = json.loads(native_files(texts)[CONFIG])
    native = from_hf(native_config)
    method = canonical_method("yarn" if method is None else method)
    if original_max_position_embeddings is None and method != "none":
        original_max_position_embeddings = _recorded_original(json.loads(texts[CONFIG]))
    if original_max_position_embeddings is None and not native.is_checkpoint_scaling:
        check_one_original(native_config)
    if factor is None:
        if method != "none":
            raise ValueError(f"factor is required for method {method!r} (e.g. --factor 4)")
        factor = 1.0
    knobs = {k: v for k, v in knobs.items() if v is not None}
    return native.rescaled(method, factor, original_max_position_embeddings, **knobs)


def _recorded_original(config: dict[str, Any]) -> int | None:
    """The original context yarnlib scaled this folder from, where it wrote the files: it may be
    one the user gave (Qwen3-8B: 32768, not the native file's 40960), and a second rewrite keeps
    it rather than taking the native max_position_embeddings."""
    if RECORD not in config and MARKER not in config:
        return None
    current = from_hf(config)
    return None if current.method == "none" else current.original_max_position_embeddings


def check_one_original(config: dict[str, Any]) -> None:
    """Refuse a config whose readers take different original contexts L (a top-level
    original_max_position_embeddings beside another one): the user must say which L."""
    lengths = original_lengths(config)
    if len(set(lengths.values())) > 1:
        read = ", ".join(f"{reader} read L={length}" for reader, length in lengths.items())
        raise ValueError(
            f"original_max_position_embeddings: config.json has it at the top level "
            f"({config.get('original_max_position_embeddings')}) and the readers disagree on the "
            f"original context ({read}); pass --original-max-position-embeddings"
        )


def _length_value(current: Any, new: int) -> Any:
    """``new`` in the type the file used: 4096.0 stays a float."""
    return float(new) if isinstance(current, float) else new


def _scale(
    native: dict[str, str],
    spec: RopeScaling,
    format: str,
    record: bool = True,
    sync_original: bool = True,
) -> dict[str, str]:
    """The files that run ``spec``, edited from the native files."""
    config = json.loads(native[CONFIG])
    doc = JsonText(native[CONFIG])
    for key in ("rope_parameters",) if format == "v4" else ("rope_scaling", "rope_theta"):
        if key in config:
            doc.remove(key)
    scaling = config.get("rope_scaling")
    legacy = isinstance(scaling, dict) and "type" in scaling and "rope_type" not in scaling
    # The rotated share of each head stays the model's: in rope_parameters, where transformers
    # 5 and vLLM read it first, or top-level beside rope_scaling (which is replaced whole).
    partial = rope_parameters_of(config).get("partial_rotary_factor")
    partial = config.get("partial_rotary_factor") if partial is None else partial
    for key, value in to_hf(spec, format).items():
        if value is None and key not in config:
            continue
        if key == "rope_scaling" and legacy and value:  # keep the file's spelling `type`
            value = {"type" if k == "rope_type" else k: v for k, v in value.items()}
        if key == "rope_parameters" and partial is not None:
            value = {**value, "partial_rotary_factor": partial}
        doc.set(key, value)
    if format == "v4" and partial is not None:
        doc.set("partial_rotary_factor", partial)
    # transformers 5 and vLLM read a top-level L before the rope dict's: both say the spec's L
    top = config.get("original_max_position_embeddings")
    if (
        sync_original
        and top is not None
        and spec.method != "none"
        and spec.original_max_position_embeddings
    ):
        doc.set(
            "original_max_position_embeddings",
            _length_value(top, spec.original_max_position_embeddings),
        )
    out = dict(native)
    out[CONFIG] = doc.text
    records = {CONFIG: doc.record()} if doc.text != native[CONFIG] else {}
    extended = spec.max_position_embeddings
    # model_max_length follows the context; generate()'s max_length is only ever raised
    for name, key, only_raise in (
        (TOKENIZER, "model_max_length", False),
        (GENERATION, "max_length", True),
    ):
        if name not in native or extended is None:
            continue
        current = _number(json.loads(native[name]).get(key))
        if current is None or current >= UNLIMITED:
            continue
        if current < extended or (current != extended and not only_raise):
            other = JsonText(native[name])
            other.set(key, _length_value(current, extended))
            out[name] = other.text
            records[name] = other.record()
    if record and records:
        doc.set(RECORD, records)
        out[CONFIG] = doc.text
    return out


def plan(
    model_dir: str | Path,
    spec: RopeScaling | None = None,
    *,
    reset: bool = False,
    format: str = "auto",
) -> list[Change]:
    """The changes that make the folder run ``spec`` (or its native settings, with ``reset``)."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if reset == (spec is not None):
        raise ValueError("plan: give either a spec or reset=True")
    texts = read_files(model_dir)
    native = native_files(texts)
    if reset:
        after = native
    else:
        native_config = json.loads(native[CONFIG])
        dim = rotary_dim_of(native_config, rope_parameters_of(native_config))
        if spec.rotary_dim != dim:
            raise ValueError(f"rotary_dim: the spec has {spec.rotary_dim}, the model has {dim}")
        model = from_hf(native_config)
        if spec.rope_theta != model.rope_theta:  # a spec for another model (integrations too)
            raise ValueError(
                f"rope_theta: the spec has {spec.rope_theta:g}, the model has "
                f"{model.rope_theta:g}; allowed: a spec for this model"
            )
        fmt = file_format(native_config) if format == "auto" else format
        # a checkpoint's own scaling, asked for as it is, stays byte for byte
        keep = spec.is_checkpoint_scaling and spec == model and format == "auto"
        after = native if keep else _scale(native, spec, fmt)
    return [Change(name, texts[name], after[name]) for name in texts]


def diff(changes: list[Change]) -> str:
    """A unified diff of the changes (empty when nothing changes)."""
    return "".join(
        "".join(
            difflib.unified_diff(
                c.before.splitlines(keepends=True),
                c.after.splitlines(keepends=True),
                f"a/{c.name}",
                f"b/{c.name}",
            )
        )
        for c in changes
        if c.changed
    )


# -- writing ------------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777 if path.exists() else 0o644


def _write_in_place(folder: Path, changes: list[Change]) -> list[Path]:
    # Checked by mode bits too: root may write anywhere, but a folder the user made read-only
    # (or an HF cache mounted so) is not ours to change.
    if not os.access(folder, os.W_OK) or not folder.stat().st_mode & 0o222:
        raise ValueError(f"model_dir: {folder} is read-only; nothing was written (try --output)")
    writes = []
    for change in changes:
        mode = _mode(folder / change.name)
        if not (folder / (change.name + ".bak")).exists():
            writes.append(file_set.Write(change.name + ".bak", None, change.before, mode))
        writes.append(file_set.Write(change.name, change.before, change.after, mode))
    # one set: a kill between two renames leaves a journal that complete_interrupted finishes
    return file_set.write(folder, writes)


def complete_interrupted(model_dir: str | Path) -> list[Path]:
    """Finish an in-place rewrite that a kill interrupted (and remove the temporary files killed
    writes left); returns the files written."""
    return file_set.complete(Path(model_dir), (*FILES, *(name + ".bak" for name in FILES)))


def _write_output(source: Path, output: Path, changes: list[Change], weights: str) -> list[Path]:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(f"output: {output} exists and is not an empty folder")
    if output.resolve().is_relative_to(source.resolve()):
        raise ValueError(f"output: {output} is inside the model folder {source}")
    new = {c.name: c.after.encode() for c in changes}
    try:  # a read-only parent, or a file where a folder is expected
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp"))
    except OSError as error:
        raise ValueError(f"output: cannot write {output}: {error.strerror}") from None
    try:
        tmp.chmod(source.stat().st_mode & 0o777)  # mkdtemp makes it private
        for root, dirs, files in os.walk(source, followlinks=True):
            dirs[:] = [d for d in dirs if d != ".git"]
            rel = Path(root).relative_to(source)
            (tmp / rel).mkdir(exist_ok=True)
            for name in files:
                src, dst = Path(root) / name, tmp / rel / name
                if str(rel / name) in new:
                    dst.write_bytes(new[str(rel / name)])
                elif weights == "symlink" and name.endswith(WEIGHT_SUFFIXES):
                    os.symlink(os.path.realpath(src), dst)
                else:
                    shutil.copyfile(src, dst)
        if output.exists():
            output.rmdir()
        os.rename(tmp, output)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"output: cannot write {output}: {error.strerror}") from None
    return [output / name for name in new]


def apply(
    model_dir: str | Path,
    changes: list[Change],
    *,
    in_place: bool = False,
    output: str | Path | None = None,
    weights: str = "symlink",
) -> list[Path]:
    """Write ``changes``: into the folder (``in_place``, keeping a ``.bak`` of each file the
    first time it changes) or into a new folder ``output``. Returns the files written."""
    if in_place == (output is not None):
        raise ValueError("apply: give exactly one of in_place=True or output=DIR")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    folder = Path(model_dir)
    changed = [c for c in changes if c.changed]
    if output is not None:
        return _write_output(folder, Path(output), changed, weights)
    return _write_in_place(folder, changed) if changed else []


# -- reporting ----------------------------------------------------------------------------------


def vllm_max_model_len(config: dict[str, Any]) -> int:
    """The max_model_len vLLM derives from config.json (its ``_get_and_verify_max_len``)."""
    if config.get("model_max_length"):
        length = config["model_max_length"]
    else:
        lengths = [config[k] for k in VLLM_LENGTH_KEYS if config.get(k) is not None]
        length = min(lengths) if lengths else 2048
    params = rope_parameters_of(config)
    if params["rope_type"] not in VLLM_PRESCALED:
        length *= params.get("factor") or 1.0
    return int(length)


def _number(value: Any) -> int | float | None:
    """A length limit as a number (integral floats included, 4096.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if isinstance(value, int) or value.is_integer() else None


def _limit(texts: dict[str, str], name: str, key: str) -> Any:
    return json.loads(texts[name]).get(key) if name in texts else None


def _recorded_rotary_dim(texts: dict[str, str]) -> int | None:
    """The rotary dim config.json had before yarnlib rewrote it (None without a record)."""
    config = json.loads(texts[CONFIG])
    try:
        native = json.loads(undo(texts[CONFIG], config[RECORD][CONFIG]))
        return rotary_dim_of(native, rope_parameters_of(native))
    except (AttributeError, KeyError, TypeError, ValueError):  # no record, or a damaged one
        return None


def _disagreeing_blocks(config: dict[str, Any]) -> str | None:
    """What transformers reads when config.json holds v4 keys (rope_theta + rope_scaling) and a
    v5 rope_parameters block that say different things (None when they agree)."""
    has_v4 = config.get("rope_scaling") or config.get("rope_theta") is not None
    if not (has_v4 and config.get("rope_parameters")):
        return None
    shared = {k: config[k] for k in ("rope_theta", "partial_rotary_factor") if k in config}
    v4 = rope_parameters_of({**shared, "rope_scaling": config.get("rope_scaling")})
    v5 = rope_parameters_of({**shared, "rope_parameters": config["rope_parameters"]})
    if shared.get("partial_rotary_factor") is not None:
        for params in (v4, v5):
            params.setdefault("partial_rotary_factor", shared["partial_rotary_factor"])
    if v4 == v5:
        return None
    read = "rope_scaling (set, it wins)" if config.get("rope_scaling") else "rope_parameters"
    return (
        f"config.json holds two RoPE blocks that disagree: rope_theta + rope_scaling say "
        f"{_flat(v4)}, rope_parameters says {_flat(v5)}; transformers 5 and vLLM read {read}, "
        "transformers 4 reads rope_theta + rope_scaling (a rewrite keeps the one transformers "
        "5 reads)"
    )


def _flat(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def show(model_dir: str | Path, vllm_version: str | None = None) -> dict[str, Any]:
    """The RoPE settings transformers and vLLM read from the folder, and what disagrees
    (vLLM: ``vllm_version``, default the installed one, else the newest read)."""
    vllm_version = versions.target(vllm_version)
    texts = read_files(model_dir)
    config = json.loads(texts[CONFIG])
    params = rope_parameters_of(config)
    problems: list[str] = []
    if params["rope_theta"] is None:
        problems.append(
            f"config.json has no rope_theta: transformers and vLLM fall back to "
            f"{DEFAULT_ROPE_THETA:g}"
        )
    params["rope_theta"] = params["rope_theta"] or DEFAULT_ROPE_THETA
    if MARKER in config:  # a damaged record is an error, as when rewriting
        check_marker(config[MARKER])
    try:
        spec = from_hf(config)
    except ValueError as error:
        spec = None
        problems.append(f"yarnlib cannot read these settings: {error}")
    if spec is not None and MARKER in config:
        marked = marked_spec(config, spec.rotary_dim)
        if marked != spec:
            problems.append(
                f"the RoPE keys were edited after yarnlib wrote {MARKER}: readers run "
                f"{spec.describe()}, not {marked.describe()}"
            )
    native_dim = _recorded_rotary_dim(texts)
    if spec is not None and native_dim not in (None, spec.rotary_dim):
        problems.append(
            f"transformers and vLLM rotate {spec.rotary_dim} dims of each head, but before "
            f"yarnlib rewrote config.json they rotated {native_dim}: its partial_rotary_factor "
            "was lost (older yarnlib versions dropped it from rope_parameters); restore the "
            ".bak files and rewrite"
        )
    hf_dims = rotated_dims(config)
    if spec is not None and hf_dims not in (None, spec.rotary_dim):
        why = ""
        if params["rope_type"] == "default":
            why = " (transformers' default RoPE for this model ignores partial_rotary_factor)"
        problems.append(
            f"transformers {transformers_version()} rotates {hf_dims} dims of each head, vLLM "
            f"{spec.rotary_dim} (head_dim × partial_rotary_factor, as yarnlib reads it): they run "
            f"different RoPE{why}"
        )
    blocks = _disagreeing_blocks(config)
    if blocks:
        problems.append(blocks)
    lengths = original_lengths(config)
    if params["rope_type"] in ("yarn", HF_DYNAMIC_YARN) and len(set(lengths.values())) > 1:
        read = ", ".join(f"{reader} run L={length}" for reader, length in lengths.items())
        problems.append(
            f"the readers take different original contexts from config.json ({read}): a "
            "top-level original_max_position_embeddings beside the rope dict's"
        )
    if file_format(config) == "v5" and hf_format() == "v4":
        problems.append(
            f"the installed transformers {transformers_version()} ignores rope_parameters: it "
            f"runs default RoPE with rope_theta {config.get('rope_theta') or DEFAULT_ROPE_THETA:g}"
            "; rewrite the file with --format v4"
        )
    native = extended = None
    if spec is not None:
        native = spec.original_max_position_embeddings
        # llama3 checkpoints state their context apart from the factor
        extended = spec.max_position_embeddings or config.get("max_position_embeddings")
    max_model_len = vllm_max_model_len(config)
    rope_type = params["rope_type"]
    if rope_type == "dynamic" and isinstance(params.get("factor"), (int, float)):
        what = versions.describe_dynamic(
            params, config.get("max_position_embeddings") or max_model_len, vllm_version
        )
        problems.append(f"{what}; transformers rescales per sequence length: they differ")
    elif rope_type == HF_DYNAMIC_YARN:
        problems.append(
            f"rope_type {rope_type!r} loads in transformers only after `import yarnlib`, and "
            "in vLLM only with yarnlib's vLLM plugin and the hf_overrides of `yarnlib "
            "vllm-args` (which fix the scale at one length)"
        )
    if extended is not None and max_model_len != extended:
        problems.append(
            f"vLLM derives max_model_len={max_model_len} from config.json, but the RoPE is "
            f"scaled for {extended} tokens"
        )
    model_max_length = _limit(texts, TOKENIZER, "model_max_length")
    limit = _number(model_max_length)
    if extended is not None and limit is not None and limit < UNLIMITED and limit != extended:
        problems.append(
            f"tokenizer_config.json model_max_length={model_max_length}, but the model's "
            f"context is {extended}"
        )
    max_length = _limit(texts, GENERATION, "max_length")
    short = _number(max_length)
    if extended is not None and short is not None and short < extended:
        problems.append(
            f"generation_config.json max_length={max_length} is below the context {extended}: "
            "generate() stops there unless told otherwise"
        )
    return {
        "model_dir": str(model_dir),
        "model_type": config.get("model_type"),
        "format": file_format(config),
        "spec": None if spec is None else spec.fields(),
        "transformers": {
            "rope_parameters": params,
            "max_position_embeddings": config.get("max_position_embeddings"),
            "attention_factor": None if spec is None else spec.attention_factor(),
        },
        "vllm": {
            "version": vllm_version,
            "rope_parameters": params,
            "max_model_len": max_model_len,
        },
        "native_context": native,
        "extended_context": extended,
        "tokenizer_model_max_length": model_max_length,
        "generation_max_length": max_length,
        "scaled_by_yarnlib": MARKER in config or RECORD in config,
        "restorable_exactly": RECORD in config,
        "inconsistencies": problems,
    }
