"""The single writer: refuses overwrites without force, refuses paths leaving the folder, writes
atomically and marks scripts executable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tcf_search.export import ExportError, ExportExists, write_exports


def test_writes_files_and_marks_scripts_executable(tmp_path: Path) -> None:
    written = write_exports({"run.sh": "echo hi\n", "sub/cfg.json": "{}\n", "job.sbatch": "x\n"},
                            tmp_path / "out")
    assert [p.name for p in written] == ["run.sh", "cfg.json", "job.sbatch"]
    assert (tmp_path / "out" / "sub" / "cfg.json").read_text() == "{}\n"
    assert os.access(tmp_path / "out" / "run.sh", os.X_OK)
    assert os.access(tmp_path / "out" / "job.sbatch", os.X_OK)
    assert not os.access(tmp_path / "out" / "sub" / "cfg.json", os.X_OK)
    assert not [p for p in (tmp_path / "out").rglob("*.tmp")]


def test_refuses_to_overwrite_without_force_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.sh").write_text("old\n")  # a file no export wrote
    with pytest.raises(ExportExists, match="--force"):
        write_exports({"b.sh": "new\n", "a.sh": "new\n"}, tmp_path)
    assert (tmp_path / "a.sh").read_text() == "old\n"
    assert not (tmp_path / "b.sh").exists()  # checked before the first write
    write_exports({"a.sh": "new\n"}, tmp_path, force=True)
    assert (tmp_path / "a.sh").read_text() == "new\n"


@pytest.mark.parametrize("name", ["../escape.sh", "/etc/passwd", "a/../../x", "", "a\\..\\b"])
def test_refuses_paths_escaping_the_folder(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(ExportError):
        write_exports({name: "x"}, out)
    assert not (tmp_path / "escape.sh").exists()


def test_refuses_a_symlink_pointing_outside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (out / "cfg.json").symlink_to(victim)
    with pytest.raises(ExportError, match="outside"):
        write_exports({"cfg.json": "x"}, out, force=True)
    assert victim.read_text() == "keep\n"


def test_refuses_to_replace_a_folder(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").mkdir()
    with pytest.raises(ExportError, match="folder"):
        write_exports({"cfg.json": "x"}, tmp_path, force=True)


def test_a_rerun_replaces_only_what_an_export_wrote(tmp_path: Path) -> None:
    write_exports({"a.sh": "one\n", "b.json": "{}\n"}, tmp_path)
    write_exports({"a.sh": "two\n", "b.json": "{}\n"}, tmp_path)  # its own files: no --force
    assert (tmp_path / "a.sh").read_text() == "two\n"
    (tmp_path / "b.json").write_text('{"edited": true}\n')  # the user's now
    with pytest.raises(ExportExists, match="b.json"):
        write_exports({"a.sh": "three\n", "b.json": "{}\n"}, tmp_path)
    assert (tmp_path / "a.sh").read_text() == "two\n"
    assert (tmp_path / "b.json").read_text() == '{"edited": true}\n'


def test_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_exports({"run.sh": "x\n", "cfg.json": "{}\n"}, tmp_path)
    finally:
        os.umask(old)
    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o750
    assert (tmp_path / "cfg.json").stat().st_mode & 0o777 == 0o640
