"""Issue 19, held for what a command writes: nothing it writes damages what is not its own, and a
rerun is harmless.

* the output policy (``search.inputs.files.Output``): devices, FIFOs, folders and symbolic links are
  never replaced; a file a command did not write needs ``--force``; the umask is obeyed; a
  signal mid-write leaves no temporary file;
* reruns of a finished study with ``export:`` exit 0 and touch nothing they do not own, and an
  output name never leaves its folder.
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

import pytest
from clirunner import ROOT, TINY, cli, one_line_error

from search.inputs import files
from search.inputs.files import Output, OutputError, OutputExists, write_atomic


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

    # SIGTERM as a shell leaves it (the default): conftest's session handler is set aside.
    session = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        monkeypatch.setattr(files.os, "fsync", terminated)
        code, _, err = cli("predict", str(cases), "-o", str(tmp_path / "OUT.csv"))
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the handler is put back"
    finally:
        signal.signal(signal.SIGTERM, session)
    assert code == 143 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.csv"]


SIGTERM_SUITE = """
import os, signal
from search.inputs import files
from tcf_search.cli import main


def test_a_command_in_process(tmp_path, monkeypatch):
    (tmp_path / "cases.csv").write_text({cases!r})
    real = os.fsync

    def terminated(fd):
        real(fd)
        os.kill(os.getpid(), signal.SIGTERM)  # as a time limit around the run sends it

    monkeypatch.setattr(files.os, "fsync", terminated)
    assert main(["predict", str(tmp_path / "cases.csv"), "-o", str(tmp_path / "o.csv")]) == 0


def test_after_it():
    raise AssertionError("the run goes on after a SIGTERM")
"""


def test_a_sigterm_to_pytest_stops_the_run_instead_of_failing_a_command(tmp_path: Path) -> None:
    """conftest's handler: a SIGTERM sent to pytest while an in-process command runs is no
    longer that command's own (exit 143, one test failed and the rest run on): the command
    finishes, the run stops after its test and says why."""
    cases = ("layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,gpu,num_gpus,global_batch\n"
             "32,4096,14336,32,8,128256,8192,h100-sxm-80gb,8,64\n")
    (tmp_path / "test_suite.py").write_text(SIGTERM_SUITE.format(cases=cases))
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_suite.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == pytest.ExitCode.INTERRUPTED, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "failed" not in done.stdout, done.stdout
    assert "pytest got SIGTERM" in done.stdout + done.stderr


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
