"""Issue 19, held: nothing a command writes damages what is not its own, a full disk loses
nothing, a rerun is harmless, names are not paths, and every bad input or signal is one line.

* the output policy (``search.files.Output``): devices, FIFOs, folders and symbolic links are
  never replaced; a file a command did not write needs ``--force``; the umask is obeyed; a
  signal mid-write leaves no temporary file;
* the storage: an append that fails on a full disk leaves no torn record, a torn record (a kill
  mid-append, or an older version) is set aside on the next run and no complete trial is lost;
  a tmpfs disk-full run where this machine can mount one;
* inputs: FIFOs and devices refused before they are opened, sizes bounded;
* reruns of a finished study with ``export:`` exit 0 and touch nothing they do not own;
* study names never become paths; storage errors carry no password; storages that cannot resume
  are refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from clirunner import cli, one_line_error
from optuna.trial import TrialState

from search import files
from search.files import Output, OutputError, OutputExists, write_atomic
from search.storage import JournalFile, SearchError, repair_journal

ROOT = Path(__file__).resolve().parents[1]
TINY = (ROOT / "studies" / "tiny-cpu.yaml").read_text()
# 377 parallel layouts (units): trials are not capped by the space
MOE = ("name: moe\nmodel: {preset: mixtral-8x7b}\n"
       "training: {seq_len: 8192, global_batch: 1024}\n"
       "cluster: {gpu: h100-sxm-80gb, nodes: 128}\n"
       "search_space: {cp: auto, ep: auto}\nsearch: {seed: 3, trials: 120}\n")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny study's result folder (copied by tests that change it)."""
    folder = tmp_path_factory.mktemp("finished")
    study = folder / "tiny.yaml"
    study.write_text(TINY)
    code, _, err = cli("run", str(study), "-o", str(folder / "out"), "-q")
    assert code == 0, err
    return folder / "out"


@pytest.fixture()
def result(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "out")
    return tmp_path / "out"


def specials(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a folder, a symlink to a precious file, and a device where root can make one."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep\n")
    made = {"fifo": tmp_path / "fifo", "folder": tmp_path / "folder",
            "symlink": tmp_path / "link"}
    os.mkfifo(made["fifo"])
    made["folder"].mkdir()
    made["symlink"].symlink_to(precious)
    with contextlib.suppress(OSError, AttributeError):  # a character device like /dev/null
        os.mknod(tmp_path / "device", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made["device"] = tmp_path / "device"
    return made


def unchanged(path: Path, kind: str) -> None:
    st = os.lstat(path)
    expect = {"fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR, "symlink": stat.S_ISLNK,
              "device": stat.S_ISCHR}[kind]
    assert expect(st.st_mode), f"{path} was replaced"
    assert not list(path.parent.glob(f".{path.name}.*.tmp")), "a temporary file was left"


# ---- the output policy ---------------------------------------------------------------------

def test_write_atomic_never_replaces_what_is_not_a_regular_file(tmp_path: Path) -> None:
    for kind, path in specials(tmp_path).items():
        with pytest.raises(OutputError, match=r"refusing to replace .*: it is "):
            write_atomic(path, "x")
        unchanged(path, kind)
    assert (tmp_path / "precious.txt").read_text() == "keep\n"


def test_report_and_predict_refuse_devices_fifos_folders_and_symlinks(result: Path,
                                                                      tmp_path: Path) -> None:
    cases = tmp_path / "cases.csv"
    cases.write_text("layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,gpu,num_gpus,"
                     "global_batch\n32,4096,14336,32,8,128256,8192,h100-sxm-80gb,8,64\n")
    for kind, path in specials(tmp_path).items():
        code, _, err = cli("report", str(result), "-o", str(path), "--no-png", "--force", "-q")
        one_line_error(code, err, str(path))
        unchanged(path, kind)
        code, _, err = cli("predict", str(cases), "-o", str(path), "--force")
        one_line_error(code, err)
        unchanged(path, kind)
    assert (tmp_path / "precious.txt").read_text() == "keep\n"


def test_report_replaces_only_its_own_file_without_force(result: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.html"
    assert cli("report", str(result), "-o", str(mine), "--no-png", "-q")[0] == 0
    assert cli("report", str(result), "-o", str(mine), "--no-png", "-q")[0] == 0  # a rerun
    theirs = tmp_path / "theirs.html"
    theirs.write_text("someone else's\n")
    code, _, err = cli("report", str(result), "-o", str(theirs), "--no-png", "-q")
    one_line_error(code, err, "--force")
    assert theirs.read_text() == "someone else's\n"
    # the study's own result file is the run's, not the report's
    code, _, err = cli("report", str(result), "-o", str(result / "result.json"), "--no-png")
    one_line_error(code, err, "result.json")
    assert json.loads((result / "result.json").read_text())["trials"] > 0
    assert cli("report", str(result), "-o", str(theirs), "--no-png", "-q", "--force")[0] == 0
    assert theirs.read_text().startswith("<!")


def test_report_to_a_folder_is_one_line_and_leaves_no_temporary(result: Path,
                                                                tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    code, _, err = cli("report", str(result), "-o", str(folder), "--no-png")
    one_line_error(code, err, "folder")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert list(folder.iterdir()) == []


def test_result_files_follow_the_umask(tmp_path: Path) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    old = os.umask(0o027)
    try:
        code, _, err = cli("run", str(study), "-o", str(tmp_path / "out"), "-q")
    finally:
        os.umask(old)
    assert code == 0, err
    for name in ("result.json", "trials.csv", "best_plan.yaml"):
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o640, name


@pytest.mark.parametrize("command", ["run", "export", "nightly"])
def test_an_existing_file_as_the_output_folder_is_one_line(tmp_path: Path, finished: Path,
                                                           command: str) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    target = tmp_path / "a-file"
    target.write_text("keep\n")
    args = {"run": ["run", str(study), "-q"],
            "export": ["export", str(finished), "-f", "megatron"],
            "nightly": ["nightly", str(study), "--no-report", "-q"]}[command]
    code, _, err = cli(*args, "-o", str(target))
    one_line_error(code, err, str(target))
    assert target.read_text() == "keep\n"


def test_a_read_only_output_folder_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        code, _, err = cli("run", str(study), "-o", str(out), "-q")
    finally:
        out.chmod(0o755)
    one_line_error(code, err, str(out))


def test_a_signal_mid_write_leaves_no_temporary(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM inside ``predict``'s write: exit 143, no ``OUT.csv``, no ``OUT.csv.tmp``."""
    cases = tmp_path / "cases.csv"
    cases.write_text("layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,gpu,num_gpus,"
                     "global_batch\n32,4096,14336,32,8,128256,8192,h100-sxm-80gb,8,64\n")
    real = os.fsync

    def terminated(fd: int) -> None:
        real(fd)
        os.kill(os.getpid(), signal.SIGTERM)  # handled before fsync returns

    monkeypatch.setattr(files.os, "fsync", terminated)
    code, _, err = cli("predict", str(cases), "-o", str(tmp_path / "OUT.csv"))
    monkeypatch.undo()
    assert code == 143 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.csv"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the handler is put back"


def test_ctrl_c_while_the_command_line_loads_is_no_traceback() -> None:
    """Ctrl-C in the first second, while the commands import: exit 130, one line."""
    code = ("import os, signal, sys\n"
            "class Hit:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'typer':\n"
            "            sys.meta_path.remove(self); os.kill(os.getpid(), signal.SIGINT)\n"
            "sys.meta_path.insert(0, Hit())\n"
            "from tcf_search.cli import main\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "interrupted"


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


# ---- inputs ---------------------------------------------------------------------------------

def _hf_study(tmp_path: Path, config: str) -> Path:
    study = tmp_path / "hf.yaml"
    study.write_text(f"name: hf\nmodel: {{hf_config: '{config}'}}\n"
                     "training: {seq_len: 4096, global_batch: 64}\n"
                     "cluster: {gpu: h100-sxm-80gb, gpus: 8}\n")
    return study


@pytest.mark.parametrize("what", ["study", "hf_config", "plan", "csv", "journal"])
@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "too-big"])
def test_fifos_devices_and_huge_inputs_are_refused(tmp_path: Path, finished: Path, what: str,
                                                   source: str) -> None:
    path = tmp_path / "input"
    if source == "fifo":
        os.mkfifo(path)  # opened for reading, it would block forever
    elif source == "too-big":
        with path.open("wb") as f:  # sparse: 300 MiB of nothing, over every limit
            f.truncate(300 * 2**20)
    else:
        path = Path(source)
        if not path.exists():
            pytest.skip(f"no {source} here")
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY)
    args = {"study": ["run", str(path), "-o", str(tmp_path / "o"), "-q"],
            "hf_config": ["run", str(_hf_study(tmp_path, str(path))), "-o", str(tmp_path / "o"),
                          "-q"],
            "plan": ["explain", str(path)],
            "csv": ["predict", str(path), "-o", str(tmp_path / "p.csv")],
            "journal": ["run", str(study), "-o", str(tmp_path / "o"), "-q", "--storage",
                        f"journal:{path}"]}[what]
    if what == "journal" and source == "too-big":
        path.write_text("not a journal\n")
    code, _, err = cli(*args)
    one_line_error(code, err, str(path))
    assert not Path(f"{path}.run-lock").exists()


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


# ---- reruns -----------------------------------------------------------------------------------

def test_rerunning_a_finished_study_with_export_changes_nothing_it_does_not_own(
        tmp_path: Path) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY + "export: {formats: [torchtitan], output: launch}\n")
    out = tmp_path / "out"
    assert cli("run", str(study), "-o", str(out), "-q")[0] == 0
    exported = sorted((out / "launch").iterdir())
    assert exported
    stamp = {p: p.stat().st_mtime_ns for p in exported}
    code, _, err = cli("run", str(study), "-o", str(out), "-q")  # the same command again
    assert code == 0, err
    assert {p: p.stat().st_mtime_ns for p in exported} == stamp, "own files, same content"
    mine = next(p for p in exported if not p.name.startswith("."))
    mine.write_text("# edited by hand\n")
    code, _, err = cli("run", str(study), "-o", str(out), "-q")
    assert code != 0 and "Traceback" not in err
    assert mine.read_text() == "# edited by hand\n", "a file the export did not write stays"


def test_a_run_killed_after_the_export_began_reruns_cleanly(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY + "export: {formats: [torchtitan, megatron], output: launch}\n")
    out = tmp_path / "out"
    real = files.write_atomic
    calls = []

    def killed(path: Path, data: str | bytes, *, mode: int | None = None) -> Path:
        if "launch" in path.parts and not path.name.startswith("."):
            calls.append(path)
            if len(calls) == 2:
                raise KeyboardInterrupt  # the kill, after the first exported file
        return real(path, data, mode=mode)

    monkeypatch.setattr(files, "write_atomic", killed)
    assert cli("run", str(study), "-o", str(out), "-q")[0] == 130
    monkeypatch.undo()
    code, _, err = cli("run", str(study), "-o", str(out), "-q")
    assert code == 0, err


def test_an_output_name_cannot_leave_its_folder(tmp_path: Path) -> None:
    out = Output(tmp_path / "o", "export")
    for name in ("../x", "/etc/passwd", "a/../../x", "", "a\\b", "x\x00y",
                 files.MANIFEST):
        with pytest.raises(OutputError):
            out.write(name, "x")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "theirs").write_text("keep\n")
    with pytest.raises(OutputExists):
        out.write("theirs", "x")
    assert (tmp_path / "o" / "theirs").read_text() == "keep\n"


# ---- names are not paths --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../../escaped", "/tmp/tcf-nightly-abs", "a/b", "..",
                                  ".hidden", "x\ny"])
def test_nightly_never_uses_a_study_name_as_a_path(tmp_path: Path, name: str) -> None:
    history = tmp_path / "deep" / "er" / "history"
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("name: tiny-cpu", f"name: {json.dumps(name)}"))
    before = set(tmp_path.rglob("*"))
    code, _, err = cli("nightly", str(study), "-o", str(history), "--no-report", "-q",
                       "--date", "2026-01-02")
    one_line_error(code, err, "study name")
    assert set(tmp_path.rglob("*")) - before <= {history, *history.parents}
    assert not Path("/tmp/tcf-nightly-abs").exists()


def test_a_study_name_with_a_lone_surrogate_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("name: tiny-cpu", 'name: "x\\ud800"'))
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q")
    one_line_error(code, err, "name")


# ---- one line, not a traceback ----------------------------------------------------------------

@pytest.mark.parametrize("setting, words", [
    ("lr=[", ["lr"]), ("lr=nan", ["lr", "finite"]), ("lr=inf", ["lr"]),
    ("train_iters=1e400", ["train_iters"]), ("megatron_script=null", ["megatron_script"]),
    ("train_iters=" + "9" * 5000, ["train_iters"]), ("master_port=0.5", ["master_port"]),
])
def test_bad_export_settings_are_one_line(finished: Path, tmp_path: Path, setting: str,
                                          words: list[str]) -> None:
    code, _, err = cli("export", str(finished), "-f", "megatron", "-o", str(tmp_path / "e"),
                       "--set", setting)
    one_line_error(code, err, *words)
    assert not (tmp_path / "e").exists()


def test_text_settings_are_taken_verbatim(finished: Path, tmp_path: Path) -> None:
    code, _, err = cli("export", str(finished), "-f", "slurm", "-o", str(tmp_path / "e"),
                       "--set", "slurm_account=0.2")
    assert code == 0, err
    assert "--account=0.2" in (tmp_path / "e" / "slurm.sbatch").read_text()


@pytest.mark.parametrize("text", [
    "num_gpus: .nan", "num_gpus: .inf", "num_gpus: -8", "num_gpus: 1" + "0" * 5000,
    "rank: [1]", "gpus_per_node: 2.5"])
def test_bad_plan_files_are_one_line(finished: Path, tmp_path: Path, text: str) -> None:
    key, value = text.split(": ", 1)
    lines = (finished / "best_plan.yaml").read_text().splitlines()
    edited = [f"{line.split(':')[0]}: {value}" if line.strip().startswith(f"{key}:") else line
              for line in lines]
    if not any(line.strip().startswith(f"{key}:") for line in lines):
        edited.append(f"{key}: {value}")
    plan = tmp_path / "plan.yaml"
    plan.write_text("\n".join(edited) + "\n")
    for args in (["explain", str(plan)], ["export", str(plan), "-f", "megatron"]):
        code, _, err = cli(*args)
        one_line_error(code, err)


@pytest.mark.parametrize("config", [
    {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 0, "vocab_size": 10},
    {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 0, "vocab_size": 10,
     "kv_lora_rank": 8},
    "[" * 100_000 + "]" * 100_000,
    '{"num_hidden_layers": ' + "9" * 5000 + "}",
    {"num_hidden_layers": 1e400},
], ids=["zero-heads", "zero-heads-mla", "deep", "huge-int", "inf"])
def test_bad_hf_configs_are_one_line(tmp_path: Path, config: object) -> None:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    code, _, err = cli("run", str(_hf_study(tmp_path, str(path))), "-o", str(tmp_path / "o"),
                       "-q")
    one_line_error(code, err, "hf_config")


def test_a_study_with_a_huge_integer_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("global_batch: 16", "global_batch: " + "9" * 5000))
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q")
    one_line_error(code, err, "study")


@pytest.mark.parametrize("args", [
    ["compare", "{study}", "--base", "tp=1,pp=1", "--with", "mbs=0"],
    ["compare", "{study}", "--base", "tp=1,pp=1", "--with", "tp=-2"],
    ["compare", "{study}", "--base", "tp=1,pp=1", "--with", "vpp=18446744073709551616"],
    ["explain", "{result}", "--plan", "recompute_n=18446744073709551616"],
    ["explain", "{result}", "--plan", "tp=18446744073709551616"],
])
def test_huge_and_zero_knobs_are_one_line(finished: Path, args: list[str]) -> None:
    study = str(ROOT / "studies" / "llama3-8b-h100x8.yaml")
    code, _, err = cli(*[a.format(study=study, result=finished) for a in args])
    one_line_error(code, err)


# ---- bounded work ---------------------------------------------------------------------------

def test_a_knob_lists_at_most_64_values(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(TINY.replace("tp: [1, 2]", f"tp: {list(range(1, 1001))}"))
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q")
    one_line_error(code, err, "search_space.tp", "at most 64 values")
    assert not (tmp_path / "o").exists()


def test_a_placement_cp_sat_cannot_find_is_a_user_facing_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from search.prune import MemoryStage

    monkeypatch.setattr(MemoryStage, "place", lambda self, i: None)
    study = tmp_path / "s.yaml"
    study.write_text(MOE)
    code, _, err = cli("run", str(study), "-o", str(tmp_path / "o"), "-q", "--trials", "30")
    one_line_error(code, err, "layer placement (CP-SAT)", "uneven_pipeline")
    assert "AssertionError" not in err
