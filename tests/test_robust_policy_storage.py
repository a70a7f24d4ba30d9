"""Issue 19, held for the trial storage: a full disk loses nothing, and a storage that cannot
serve the study is one line.

* an append that fails on a full disk leaves no torn record, a torn record (a kill mid-append,
  or an older version) is set aside on the next run and no complete trial is lost; a tmpfs
  disk-full run where this machine can mount one;
* storages that cannot resume are refused, storage errors carry no password, and a file that
  is no journal is refused without a lock file.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import optuna
import pytest
from clirunner import MOE, TINY, cli, one_line_error
from optuna.trial import TrialState

from search.storage import JournalFile, SearchError, repair_journal

# ---- the storage on a full disk -------------------------------------------------------------

def test_a_failed_append_leaves_the_journal_as_it_was(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "study.journal"
    backend = JournalFile(str(path))
    backend.append_logs([{"op_code": 0, "worker_id": "w", "study_name": "s"}])
    before = path.read_bytes()
    real = os.write

    def full(fd: int, data: bytes | memoryview) -> int:
        real(fd, bytes(data[:7]))  # part of the record lands, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(SearchError, match=r"cannot append to .*study.journal \(No space left"):
        backend.append_logs([{"op_code": 1, "worker_id": "w", "study_id": 0}])
    monkeypatch.undo()
    assert path.read_bytes() == before, "no torn record is left behind"


def _trials(out: Path, name: str = "tiny-cpu") -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.JournalStorage(JournalFile(str(out / "study.journal")))
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


@pytest.mark.parametrize("where", ["tail", "middle"])
def test_a_torn_record_is_set_aside_and_nothing_complete_is_lost(tmp_path: Path,
                                                                 where: str) -> None:
    """``tail``: a kill in mid-append; ``middle``: an older version appended after one."""
    study = tmp_path / "moe.yaml"
    study.write_text(MOE)
    out = tmp_path / "out"
    assert cli("run", str(study), "-o", str(out), "-q", "--trials", "4")[0] == 0
    done = {t.number: t.values for t in _trials(out, "moe") if t.state == TrialState.COMPLETE}
    journal = out / "study.journal"
    torn = b'{"op_code":4,"worker_id":"x","trial_id":9,"par'
    if where == "tail":
        journal.write_bytes(journal.read_bytes() + torn)
    else:
        lines = journal.read_bytes().splitlines(keepends=True)
        journal.write_bytes(b"".join([*lines[:-2], torn + lines[-2], lines[-1]]))
    code, _, err = cli("run", str(study), "-o", str(out), "-q", "--trials", "8")
    assert code == 0, err
    assert "set aside" in err and "study.journal.torn" in err
    assert torn in (out / "study.journal.torn").read_bytes()
    after = _trials(out, "moe")
    complete = {t.number: t.values for t in after if t.state == TrialState.COMPLETE}
    assert all(complete[n] == v for n, v in done.items()), "a completed trial was lost"
    assert len(complete) == 8
    assert repair_journal(journal, full=True) is None, "the journal is whole again"


def test_a_full_disk_then_room_again_on_tmpfs(tmp_path: Path) -> None:
    """The issue's repro on a real 300 KiB tmpfs: one line naming the path, then the rerun
    resumes once there is room, every completed trial kept."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip() or 'not permitted'}")
    try:
        study = tmp_path / "moe.yaml"  # 120 trials of a few KiB each: more than 300 KiB
        study.write_text(MOE)
        out = mnt / "r"
        code, _, err = cli("run", str(study), "-o", str(out), "-q")
        one_line_error(code, err, str(out), "No space left")
        assert not list(out.glob(".*.tmp"))
        kept = {t.number: t.values for t in _trials(out, "moe")
                if t.state == TrialState.COMPLETE}
        subprocess.run(["mount", "-o", "remount,size=20m", str(mnt)], check=True)
        code, _, err = cli("run", str(study), "-o", str(out), "-q")
        assert code == 0 and "Traceback" not in err, err
        complete = {t.number: t.values for t in _trials(out, "moe")
                    if t.state == TrialState.COMPLETE}
        assert len(complete) == 120 and all(complete[n] == v for n, v in kept.items())
        assert json.loads((out / "result.json").read_text())["trials"] == 120
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ---- storages that cannot serve the study ----------------------------------------------------

@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://",
                                 "sqlite:///file:x?mode=memory&uri=true"])
def test_storages_that_cannot_resume_are_refused(tmp_path: Path, url: str) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q", "--storage", url)
    one_line_error(code, err, "memory")


def test_storage_errors_never_print_the_password(tmp_path: Path) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    for url in ("postgresql://alice:s3cr%40t-pw@127.0.0.1:1/db",
                "postgresql+nodriver://alice:s3cr@t-pw@127.0.0.1:1/db",
                "mysql://alice:s3cr@t-pw@[::1/db"):
        code, out, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q",
                             "--storage", url)
        one_line_error(code, err, "alice")
        assert "s3cr" not in err + out and "t-pw" not in err + out, err


def test_a_file_that_is_no_journal_is_refused_without_a_lock_file(tmp_path: Path) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q", "--storage",
                       f"journal:{notes}")
    one_line_error(code, err, "not an Optuna journal")
    assert notes.read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "tiny.yaml"]
