"""Dataset sources of the evaluations and fine-tuning: files refused with a clear error."""

import json
import re

import pytest

from yarnlib.documents import load_documents


@pytest.mark.parametrize(
    "name,content,where",
    [
        ("png.txt", b"\x89PNG\r\n\x1a\n\x00\x00", "byte 0x89 at offset 0"),
        ("zeros.txt", b"text\x00\x00\x00", "byte 0x00 at offset 4"),  # valid UTF-8, binary
        ("elf.txt", b"\x7fELF\x02\x01\x01\x00\x00\xd0", "byte 0x00 at offset 7"),  # the first
        ("rows.jsonl", b'{"text": "ok"}\n\xff\xfe{"text"', "byte 0xff at offset 15"),
    ],
    ids=["png", "nul", "elf", "jsonl"],
)
def test_binary_files_are_refused_naming_the_file(tmp_path, name, content, where):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match="is binary, not UTF-8 text") as error:
        load_documents([str(path)])
    assert str(path) in str(error.value) and where in str(error.value)


def test_a_parquet_file_that_is_none_is_refused_naming_it(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_text("text,not parquet\n")
    with pytest.raises(ValueError, match=re.escape(f"dataset: {path} is not a parquet file (")):
        load_documents([str(path)])


def test_utf8_text_is_read_exactly(tmp_path):
    (tmp_path / "a.txt").write_text("thou art — ünïcode\n", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "é"}) + "\n", encoding="utf-8")
    assert load_documents([str(tmp_path)]) == [("a", "thou art — ünïcode\n"), ("b[0]", "é")]


def test_a_missing_local_path_never_reaches_the_hub(tmp_path, capsys):
    for source in (str(tmp_path / "typo"), "data/typo/name", "./name", "typo.jsonl"):
        with pytest.raises(ValueError, match=re.escape(f"dataset: '{source}' does not exist")):
            load_documents([source])
    assert "datasets id" not in capsys.readouterr().err  # refused before any hub access


def test_a_mistyped_folder_is_said_to_be_no_local_path_before_the_hub(capsys):
    # `typo/name` reads like a datasets id (owner/name): say so first, then try it (offline here)
    with pytest.raises(ValueError, match="nor a loadable datasets id"):
        load_documents(["typo/name"])
    assert "dataset: 'typo/name' is not a local path" in capsys.readouterr().err
