"""Issue 39, items 7 and 8: a study file (or a copied result folder) keeps its storage inside the
result folder, and a storage URL never shows its password.

* ``search.storage`` in a study file: a journal or SQLite file named relative to the result
  folder; an absolute path, ``..``, a link out of the folder or a database server is refused in
  one line before anything is written (``--storage`` on the command line is the user's own and
  goes anywhere); the default journal linked out of the folder is refused too;
* ``validate`` records into a result folder's storage only when it is a file inside the folder;
* ``?password=`` in a URL is masked in errors and ``result.json``; ``--storage sqlite:///NEW/x.db``
  makes its folder, as ``journal:`` does.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from clirunner import TINY, cli, one_line_error
from hosts import PG_URL, SMALL, postgres_missing

from tcf_search.validate.record import record_in_study


def _files(root: Path, but: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(but)}


def _study(tmp_path: Path, storage: str) -> Path:
    study = tmp_path / "study.yaml"
    study.write_text(SMALL.replace("search: {trials: 500}",
                                   f"search: {{trials: 3, storage: {json.dumps(storage)}}}"))
    return study


@pytest.mark.parametrize("storage", [
    "journal:{outside}/x.journal", "journal:../x.journal", "journal:link/x.journal",
    "sqlite:///{outside}/x.db", "sqlite:///../x.db", "sqlite:///%2e%2e/x.db",
    "sqlite:///link/x.db"])
def test_a_study_file_cannot_put_its_storage_outside_the_result_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "runs" / "x"
    out.mkdir(parents=True)
    (out / "link").symlink_to(outside)
    study = _study(tmp_path, storage.format(outside=outside))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # a path relative to it lands in tmp_path too
    before = _files(tmp_path, out)
    code, _, err = cli("run", str(study), "-o", str(out), "-q")
    one_line_error(code, err, "search.storage", "inside the result folder")
    assert _files(tmp_path, out) == before, "a file written outside the result folder"
    assert not list(outside.iterdir())


def test_a_study_file_cannot_name_a_database_server(tmp_path: Path) -> None:
    study = _study(tmp_path, "postgresql://alice:s3cr3t-pw@127.0.0.1:1/db")
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q")
    one_line_error(code, err, "--storage", "postgresql://alice:***@127.0.0.1:1/db")
    assert "s3cr3t" not in err


@pytest.mark.parametrize("storage", ["journal:sub/study.journal", "sqlite:///sub/study.db"])
def test_a_study_file_storage_is_relative_to_the_result_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str) -> None:
    study = _study(tmp_path, storage)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "out"
    code, _, err = cli("run", str(study), "-o", str(out), "-q")
    assert code == 0, err
    assert (out / "sub" / storage.rpartition("/")[2]).is_file()
    assert not list(cwd.iterdir())


def test_a_default_journal_linked_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    out = tmp_path / "copied"
    out.mkdir()
    (out / "study.journal").symlink_to(tmp_path / "elsewhere.journal")
    code, _, err = cli("run", str(study), "-o", str(out), "-q")
    one_line_error(code, err, "study.journal", "inside the result folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copied", "tiny.yaml"]


def test_validate_records_only_into_a_storage_inside_the_folder(tmp_path: Path) -> None:
    """A copied ``result.json`` naming a SQLite file elsewhere: that file is not made."""
    folder = tmp_path / "copied"
    folder.mkdir()
    evil = tmp_path / "evil.db"
    (folder / "result.json").write_text(json.dumps(
        {"search": {"study_name": "x", "storage": f"sqlite:///{evil}"}}))
    assert "validation.csv only" in record_in_study(folder, [], {})
    assert not evil.exists()


def test_a_password_in_the_url_query_is_masked(tmp_path: Path) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q", "--storage",
                       "postgresql://alice@127.0.0.1:1/db?sslmode=disable&password=s3cr3t-pw")
    one_line_error(code, err, "postgresql://alice@127.0.0.1:1/db?sslmode=disable&password=***")
    assert "s3cr3t" not in err


def test_a_password_in_the_url_query_stays_out_of_the_result(tmp_path: Path) -> None:
    if (why := postgres_missing()) is not None:
        pytest.skip(why)
    study = tmp_path / "small.yaml"
    # a study of its own in the shared database: another checkout's "small" may be there
    study.write_text(SMALL.replace("name: small", f"name: small-{uuid.uuid4().hex[:12]}"))
    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}password=s3cr3t-pw"  # trust: not checked
    out = tmp_path / "o"
    code, _, err = cli("run", str(study), "-o", str(out), "-q", "--storage", url,
                       "--trials", "2")
    assert code == 0, err
    shown = json.loads((out / "result.json").read_text())["search"]["storage"]
    assert shown.endswith("password=***")
    assert not [p for p in out.rglob("*") if p.is_file() and b"s3cr3t" in p.read_bytes()]


def test_a_sqlite_storage_in_a_new_folder(tmp_path: Path) -> None:
    study = tmp_path / "small.yaml"
    study.write_text(SMALL)
    db = tmp_path / "runs" / "new" / "study.db"
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q", "--storage",
                       f"sqlite:///{db}", "--trials", "2")
    assert code == 0, err
    assert db.is_file()
