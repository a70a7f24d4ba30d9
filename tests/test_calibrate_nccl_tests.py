"""``tcf-search calibrate --nccl-tests``: nccl-tests output files made from a known cluster
(``nccl_tests_files``: 2 nodes x 8 H100, the format of nccl-tests' src/util.cu) give back the
bandwidths they were made from, and a study anchored on the file written prices its collectives
with them (issue #37)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nccl_tests_files as nt
import pytest
import yaml
from clirunner import cli, one_line_error

from costmodel import MeasuredLinks
from search.inputs import ClusterCalibration, calibration_yaml

STUDY = ("name: anchored\nmodel: {preset: llama3-8b}\n"
         "cluster: {gpu: h100-sxm-80gb, nodes: 2, gpus_per_node: 8%s}\n"
         "training: {framework: megatron-lm, seq_len: 8192, global_batch_tokens: 4194304}\n")
PLAN = "tp=1,pp=1,mbs=1,zero=0"  # DP 16 over 2 nodes: the gradient all-reduce crosses the network


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    folder = tmp_path_factory.mktemp("nccl")
    files = nt.write_set(folder)
    out = folder / "my-cluster.yaml"
    code, stdout, err = cli("calibrate", "--nccl-tests", *map(str, files), "-o", str(out))
    assert code == 0, err
    return folder, yaml.safe_load(out.read_text()), stdout


def test_recovers_the_bandwidths_the_files_were_made_from(fitted: tuple[Path, dict, str]) -> None:
    _, doc, stdout = fitted
    links = doc["links"]
    assert links["nvlink_bw_bytes_per_s"] == pytest.approx(nt.NV, rel=0.05)
    assert links["network_bw_bytes_per_s"] == pytest.approx(nt.NET, rel=0.05)
    assert links["all_to_all_bw_ratio"] == pytest.approx(nt.A2A, rel=0.05)
    assert links["nvlink_step_latency_s"] == pytest.approx(nt.NV_STEP, rel=0.1)
    assert links["network_step_latency_s"] == pytest.approx(nt.NET_STEP, rel=0.1)
    assert links["p2p_network_bw_bytes_per_s"] == 0  # no sendrecv file: not measured
    assert doc["device"] == "NVIDIA H100 80GB HBM3"
    assert {f["file"] for f in doc["fits"]} == set(doc["files"])
    assert all(f["rms_error"] < 0.02 for f in doc["fits"])
    assert "NVLink: 360.0 GB/s" in stdout or "NVLink: 359.9 GB/s" in stdout


def _dp_reduce(folder: Path, study: str, *extra: str, plan: str = PLAN,
               name: str = "dp_grad_reduce") -> tuple[float, dict]:
    path = folder / f"{study}.yaml"
    code, out, err = cli("explain", str(path), "--plan", plan, "--json", *extra)
    assert code == 0, err
    doc = json.loads(out)
    (dp,) = [c for c in doc["communication"]["collectives"] if c["name"] == name]
    assert dp["group_size"] == 16 and dp["tier"] == "network"
    return dp["time_s"], doc["calibration"]


def test_an_anchored_study_prices_its_dp_all_reduce_with_them(
        fitted: tuple[Path, dict, str]) -> None:
    folder, doc, _ = fitted
    # the same cluster with the figures the files were made from, written as calibrate writes
    truth = ClusterCalibration(links=MeasuredLinks(
        nvlink_bw_bytes_per_s=nt.NV, network_bw_bytes_per_s=nt.NET,
        nvlink_step_latency_s=nt.NV_STEP, network_step_latency_s=nt.NET_STEP),
        all_to_all_bw_ratio=nt.A2A, files=("truth",), date="2026-12-06")
    (folder / "truth.yaml").write_text(calibration_yaml(truth, []))
    (folder / "plain.yaml").write_text(STUDY % "")
    (folder / "fitted.yaml").write_text(STUDY % ", calibration: my-cluster.yaml")
    (folder / "true.yaml").write_text(STUDY % ", calibration: truth.yaml")
    plain, plain_cal = _dp_reduce(folder, "plain")
    anchored, cal = _dp_reduce(folder, "fitted")
    true, _ = _dp_reduce(folder, "true")
    assert anchored == pytest.approx(true, rel=0.05)
    # the family's network figure is not this cluster's: anchoring moves the price
    assert abs(anchored / plain - 1) > 0.1
    assert plain_cal["anchored"] is None
    assert cal["anchored"]["links"]["network_bw_bytes_per_s"] == pytest.approx(
        doc["links"]["network_bw_bytes_per_s"])
    assert "anchored on 4 nccl-tests of this cluster" in cal["line"]
    assert "all_reduce_2x8.txt" in cal["line"]
    # --calibration on explain anchors the plain study the same way
    again, cal2 = _dp_reduce(folder, "plain", "--calibration", str(folder / "my-cluster.yaml"))
    assert again == pytest.approx(anchored) and cal2["anchored"] is not None
    code, out, err = cli("explain", str(folder / "fitted.yaml"), "--plan", PLAN)
    assert code == 0 and "anchored on 4 nccl-tests" in " ".join(out.split()), err
    # the EP all-to-all over both nodes: the fitted ratio on the fitted links
    for study in ("fitted", "true"):
        text = (folder / f"{study}.yaml").read_text().replace("llama3-8b", "qwen3-30b-a3b")
        (folder / f"moe-{study}.yaml").write_text(text)
    a2a = {s: _dp_reduce(folder, f"moe-{s}", plan="tp=1,pp=1,ep=16,zero=1",
                         name="ep_token_all_to_all")[0] for s in ("fitted", "true")}
    assert a2a["fitted"] == pytest.approx(a2a["true"], rel=0.05)


def _links(tmp_path: Path, path: Path, *extra: str) -> tuple[dict, str]:
    """The links ``calibrate --nccl-tests PATH`` fits (and what it prints)."""
    out = tmp_path / "c.yaml"
    code, stdout, err = cli("calibrate", "--nccl-tests", str(path), *extra, "-o", str(out))
    assert code == 0, err
    return yaml.safe_load(out.read_text())["links"], stdout


def test_a_lone_host_fits_nvlink_only(tmp_path: Path) -> None:
    path = tmp_path / "ar.txt"
    path.write_text(nt.output("all_reduce", 1, 8))
    links, stdout = _links(tmp_path, path)
    assert links["nvlink_bw_bytes_per_s"] == pytest.approx(nt.NV, rel=0.05)
    assert links["network_bw_bytes_per_s"] == 0 and links["network_step_latency_s"] == 0
    assert "network: not measured" in stdout


def test_many_hosts_alone_need_the_gpus_nvlink(tmp_path: Path) -> None:
    path = tmp_path / "ar.txt"
    path.write_text(nt.output("all_reduce", 2, 8))
    one_line_error(*cli("calibrate", "--nccl-tests", str(path))[::2], f"{path}:1",
                   "single-host", "--gpu")
    links, _ = _links(tmp_path, path, "--gpu", "h100-sxm-80gb")
    assert links["nvlink_bw_bytes_per_s"] == 0  # the catalog's stood in: not written
    # H100's catalogued NVLink x hopper's fitted fraction is not the files' 360 GB/s, so the
    # network figure absorbs the difference; it is still this cluster's order
    assert links["network_bw_bytes_per_s"] == pytest.approx(nt.NET, rel=0.5)


def test_sendrecv_across_hosts_gives_the_point_to_point_bandwidth(tmp_path: Path) -> None:
    path = tmp_path / "sendrecv_perf.log"
    path.write_text(nt.output("sendrecv", 2, 8))
    links, _ = _links(tmp_path, path)
    assert links["p2p_network_bw_bytes_per_s"] == pytest.approx(nt.P2P, rel=0.05)


def test_older_output_is_named_by_its_file(tmp_path: Path) -> None:
    """Releases before the 'Collective test starting' line (and, older, the rank lines' Group):
    the file's name says which test."""
    text = nt.output("all_gather", 1, 8).replace("# Collective test starting: all_gather_perf\n",
                                                 "").replace(" Group  0", "")
    (tmp_path / "all_gather_perf.out").write_text(text)
    (tmp_path / "run1.out").write_text(text)
    code, _, err = cli("calibrate", "--nccl-tests", str(tmp_path / "all_gather_perf.out"))
    assert code == 0, err
    one_line_error(*cli("calibrate", "--nccl-tests", str(tmp_path / "run1.out"))[::2],
                   f"{tmp_path / 'run1.out'}:1", "which nccl-tests binary")


def _broken(text: str, how: str) -> tuple[str, int]:
    """``text`` broken ``how``, and the line the error must name."""
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("1048576 "))
    if how == "cut row":
        lines[row] = lines[row][:70]
        return "\n".join(lines), row + 1
    if how == "bad number":
        parts = lines[row].split()
        parts[5] = "12.3.4"
        lines[row] = "  ".join(parts)
        return "\n".join(lines), row + 1
    if how == "wrong elements":
        parts = lines[row].split()
        parts[8] = "17"
        lines[row] = "  ".join(parts)
        return "\n".join(lines), row + 1
    assert how == "partial"  # the run died mid-table
    kept = lines[:row + 1]
    return "\n".join(kept), len(kept)


@pytest.mark.parametrize(("how", "words"), [
    ("cut row", "columns"), ("bad number", "must be numbers"),
    ("wrong elements", "wrong elements"), ("partial", "partial run")])
def test_a_malformed_file_is_one_line_naming_file_and_line(tmp_path: Path, how: str,
                                                           words: str) -> None:
    good = tmp_path / "all_reduce_2x8.txt"
    good.write_text(nt.output("all_reduce", 2, 8))
    text, line = _broken(nt.output("all_reduce", 1, 8), how)
    bad = tmp_path / "all_reduce_1x8.txt"
    bad.write_text(text)
    code, out, err = cli("calibrate", "--nccl-tests", str(good), str(bad), "-o",
                         str(tmp_path / "c.yaml"))
    one_line_error(code, err, f"{bad}:{line}:", words)
    assert not (tmp_path / "c.yaml").exists()


def test_no_files_or_no_ranks_or_nothing_priced(tmp_path: Path) -> None:
    one_line_error(*cli("calibrate", "--nccl-tests")[::2], "--nccl-tests")
    lone = tmp_path / "sendrecv.txt"
    lone.write_text(nt.output("sendrecv", 1, 8))
    one_line_error(*cli("calibrate", "--nccl-tests", str(lone))[::2], f"{lone}:1",
                   "no file measures")
    text = "\n".join(line for line in nt.output("all_reduce", 1, 8).splitlines()
                     if "Rank" not in line)
    path = tmp_path / "all_reduce.txt"
    path.write_text(text)
    one_line_error(*cli("calibrate", "--nccl-tests", str(path))[::2], f"{path}:", "Rank")


def test_a_study_on_a_missing_or_foreign_calibration_is_one_line(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(STUDY % ", calibration: nope.yaml")
    one_line_error(*cli("explain", str(study), "--plan", PLAN)[::2], "cluster.calibration",
                   "nope.yaml")
    (tmp_path / "nope.yaml").write_text("links: {}\n")
    one_line_error(*cli("explain", str(study), "--plan", PLAN)[::2], "cluster.calibration",
                   "format")


def test_a_result_folder_stays_anchored(fitted: tuple[Path, dict, str]) -> None:
    """run --calibration writes the calibration into its plan files; explain of the folder
    prices the plan on it again."""
    folder, _, _ = fitted
    study = folder / "small.yaml"
    study.write_text(STUDY % "" + "search: {trials: 10, seed: 0}\n")
    out = folder / "run"
    code, _, err = cli("run", str(study), "-o", str(out), "--quiet", "--calibration",
                       str(folder / "my-cluster.yaml"))
    assert code == 0, err
    assert "calibration: " in (out / "best_plan.yaml").read_text()
    code, text, err = cli("explain", str(out), "--json")
    assert code == 0, err
    assert "anchored on 4 nccl-tests" in json.loads(text)["calibration"]["line"]
    result = json.loads((out / "result.json").read_text())
    assert "anchored on 4 nccl-tests" in json.dumps(result)


def test_compare_takes_the_calibration_as_run_and_explain_do(
        fitted: tuple[Path, dict, str]) -> None:
    """compare --calibration prices both plans on the file, as the study naming it does, and
    says so; without it the DP all-reduce of TP 1 vs TP 8 moves differently."""
    folder, _, _ = fitted
    (folder / "cmp-plain.yaml").write_text(STUDY % "")
    (folder / "cmp-named.yaml").write_text(STUDY % ", calibration: my-cluster.yaml")
    docs = {}
    for name, extra in (("flag", ("--calibration", str(folder / "my-cluster.yaml"))),
                        ("named", ()), ("plain", ())):
        study = folder / f"cmp-{'plain' if name == 'flag' else name}.yaml"
        code, out, err = cli("compare", str(study), "--base", PLAN, "--with", "tp=8", "--json",
                             *extra)
        assert code == 0, err
        docs[name] = json.loads(out)
    assert docs["flag"]["base"]["values"] == docs["named"]["base"]["values"]
    assert docs["flag"]["techniques"][0]["deltas"] == docs["named"]["techniques"][0]["deltas"]
    assert docs["flag"]["base"]["values"]["comm_exposed_s"] != \
        docs["plain"]["base"]["values"]["comm_exposed_s"]
    assert "anchored on 4 nccl-tests" in docs["flag"]["calibration"]["line"]
    assert docs["plain"]["calibration"]["anchored"] is None


@pytest.mark.parametrize("how", ["study", "flag"])
def test_a_moved_result_folder_finds_its_calibration(fitted: tuple[Path, dict, str],
                                                     tmp_path: Path, how: str) -> None:
    """A relative calibration path (the study's cluster.calibration, or --calibration relative
    to the working folder) is written into the plan files relative to each file; the folder
    moved with its calibration file still explains anchored, not on the family's links."""
    folder, _, _ = fitted
    project = tmp_path / "project"
    project.mkdir()
    (project / "my-cluster.yaml").write_text((folder / "my-cluster.yaml").read_text())
    named = ", calibration: my-cluster.yaml" if how == "study" else ""
    (project / "s.yaml").write_text(STUDY % named + "search: {trials: 10, seed: 0}\n")
    extra = ("--calibration", "my-cluster.yaml") if how == "flag" else ()
    cwd = os.getcwd()
    os.chdir(project)  # --calibration is relative to the working folder
    try:
        code, _, err = cli("run", "s.yaml", "-o", "runs/s", "--quiet", *extra)
    finally:
        os.chdir(cwd)
    assert code == 0, err
    best = yaml.safe_load((project / "runs/s/best_plan.yaml").read_text())
    assert best["cluster"]["calibration"] == "../../my-cluster.yaml"
    rank1 = yaml.safe_load((project / "runs/s/top/rank-1.yaml").read_text())
    assert rank1["cluster"]["calibration"] == "../../../my-cluster.yaml"
    moved = tmp_path / "elsewhere" / "project"
    shutil.move(str(project), str(moved))
    for target in (moved / "runs/s", moved / "runs/s/top/rank-1.yaml"):
        code, text, err = cli("explain", str(target), "--json")
        assert code == 0, err
        cal = json.loads(text)["calibration"]
        assert "anchored on 4 nccl-tests" in cal["line"]
        assert cal["anchored"] is not None
    # the calibration file left behind: one line naming the path that is gone, no traceback
    (moved / "my-cluster.yaml").unlink()
    one_line_error(*cli("explain", str(moved / "runs/s"), "--json")[::2], "calibration")
