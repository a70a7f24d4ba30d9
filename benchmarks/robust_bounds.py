"""Work and memory stay bounded on hostile input (issue 39, items 2 and 5).

``python benchmarks/robust_bounds.py [--quick]``. Three parts:

1. **YAML alias bombs** of several shapes (nested lists, nested mappings, wide, doubling lists,
   doubling ``<<`` merges, an alias inside its own node), each in several fields, through every
   command that reads YAML a user gives: ``run``, ``explain`` and ``compare`` on a study,
   ``nightly`` on a folder, ``export`` and ``explain`` on a plan file, ``validate`` on a result
   folder, ``export --set``, ``calibrate --gpu-file``. One child process per command (2 GiB
   address-space cap, a time limit) runs its inputs in-process and measures each one's peak
   Python memory (``tracemalloc``). Counted: inputs, tracebacks, and damage: a run that is not
   one ``error:`` line with exit 2, that took over 10 s or over 64 MiB, or a child that died.
2. **The memory screen's budget**: 4,096 layers on 2**20 GPUs (the issue's 12 GB
   ``MemoryError``) and two more studies over the budget, as ``tcf-search run`` processes
   (peak RSS from ``wait4``): one line, exit 2, nothing written.
3. **predict on a long CSV**: a sweep of 10**6 rows (``--quick``: 10**5), each with its own
   case_id and measured tokens/s, as one ``tcf-search predict`` process: wall time and peak RSS;
   the output checked for every row once (lost, duplicated). The full run also predicts 10**5
   rows whose ``notes`` all differ (a cell predict reads, so rows are matched by their case, not
   their cells) and ``measured_runs.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT.parent / "shared" / "data" / "measured_runs.csv"
MIB = 2**20
AS_LIMIT = 2 * 2**30  # the issue's cap: under it the alias bomb ended in a MemoryError
MAX_SECONDS, MAX_PEAK = 10.0, 64 * MIB  # an alias bomb refused costs neither


# ---- 1. alias bombs ----------------------------------------------------------------------------

def laughs(levels: int = 9, width: int = 10) -> str:
    items = ['&l0 "lol"'] + [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]"
                             for i in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


def mapping_laughs(levels: int = 9, width: int = 10) -> str:
    items = ['&m0 "lol"'] + [f"&m{i} {{" + ", ".join(f"k{j}: *m{i - 1}" for j in range(width))
                             + "}" for i in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


def doubling(levels: int = 40) -> str:
    items = ["&d0 [x]"] + [f"&d{i} [*d{i - 1}, *d{i - 1}]" for i in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


def merges(levels: int = 40) -> str:
    items = ["&g0 {k: 1}"] + [f"&g{i} {{<<: [*g{i - 1}, *g{i - 1}]}}" for i in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


def wide(width: int = 2000) -> str:
    return "[&w0 [" + ", ".join(["lol"] * width) + "], [" + ", ".join(["*w0"] * width) + "]]"


BOMBS = {"lists 10^9": laughs(), "mappings 10^9": mapping_laughs(), "doubling 2^40": doubling(),
         "merges 2^40": merges(), "wide 2000x2000": wide(), "self": "&s [*s]"}
STUDY = ("name: bomb\nmodel: {{preset: llama3-8b, name: {name}}}\n"
         "training: {{seq_len: 4096, global_batch: {batch}}}\n"
         "cluster: {{gpu: h100-sxm-80gb, nodes: 1}}\nsearch_space: {{tp: {tp}}}\n"
         "export: {{formats: [megatron], options: {{lr: {lr}}}}}\n{extra}")
STUDY_FIELDS = ["name", "batch", "tp", "lr", "extra"]
PLAN = ("format_version: 1\nstudy: {study}\nrank: {rank}\ncluster: {{gpu: h100-sxm-80gb, "
        "num_gpus: 8}}\nmodel: {{name: x}}\ntraining: {{seq_len: 4096}}\nplan: {{tp: {tp}}}\n"
        "predicted: {predicted}\n")
PLAN_FIELDS = ["study", "rank", "tp", "predicted"]
COMMANDS = ["run", "explain-study", "compare", "nightly", "export-plan", "explain-plan",
            "validate", "export-set", "calibrate-gpu-file"]

# The child: every input of one command, in this process, each measured with tracemalloc.
CHILD = r"""
import json, os, sys, time, traceback, tracemalloc
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from clirunner import cli
jobs = json.loads(open(sys.argv[2]).read())
cli(*jobs[0]["argv"])  # once untraced: the command's modules load, not counted as its memory
tracemalloc.start()
for job in jobs:
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    try:
        code, out, err = cli(*job["argv"])
    except BaseException:
        code, out, err = -1, "", traceback.format_exc()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    print(json.dumps({"label": job["label"], "code": code, "err": err[-2000:],
                      "seconds": seconds, "peak": peak}), flush=True)
"""


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _jobs(command: str, sandbox: Path) -> list[dict[str, Any]]:
    """The inputs of one command: every bomb in every field it reads."""
    jobs = []
    for shape, bomb in BOMBS.items():
        fields = (["lr"] if command == "export-set" else ["id"] if command == "calibrate-gpu-file"
                  else PLAN_FIELDS if command in ("export-plan", "explain-plan", "validate")
                  else STUDY_FIELDS)
        for field in fields:
            label = f"{command} | {shape} | {field}"
            d = sandbox / f"{command}-{len(jobs)}"
            d.mkdir()
            if command in ("export-plan", "explain-plan", "validate"):
                values = {"study": "x", "rank": "1", "tp": "1", "predicted": "{}", field: bomb}
                text = PLAN.format(**values)
                (d / "top").mkdir()
                (d / "top" / "rank-1.yaml").write_text(text)
                (d / "best_plan.yaml").write_text(text)
                argv = {"export-plan": ["export", str(d / "best_plan.yaml"), "-f", "megatron",
                                        "-o", str(d / "e")],
                        "explain-plan": ["explain", str(d / "best_plan.yaml"), "--plan", "tp=1"],
                        "validate": ["validate", str(d), "--top", "1", "--memory-only"]}[command]
            elif command == "export-set":
                argv = ["export", str(d / "none"), "-f", "megatron", "--set", f"lr={bomb}"]
            elif command == "calibrate-gpu-file":
                (d / "gpu.yaml").write_text(f"id: {bomb}\n")
                argv = ["calibrate", "--gpu-file", str(d / "gpu.yaml"), "--from", str(d)]
            else:
                values = {"name": "x", "batch": "64", "tp": "1", "lr": "0.001", "extra": ""}
                values[field] = f"x: {bomb}\n" if field == "extra" else bomb
                (d / "studies").mkdir()
                study = d / "studies" / "bomb.yaml"
                study.write_text(STUDY.format(**values))
                argv = {"run": ["run", str(study), "-o", str(d / "out")],
                        "explain-study": ["explain", str(study), "--plan", "tp=1"],
                        "compare": ["compare", str(study)],
                        "nightly": ["nightly", str(d / "studies"), "-o", str(d / "history")],
                        }[command]
            jobs.append({"label": label, "argv": argv})
    return jobs


def alias_bombs() -> dict[str, int]:
    print("\n## YAML alias bombs through every command that reads YAML\n")
    tally: Counter[str] = Counter()
    worst_peak, worst_s, slowest, bad = 0, 0.0, "", []
    by_command: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp)
        for command in COMMANDS:
            jobs = _jobs(command, sandbox)
            spec = sandbox / f"{command}.json"
            spec.write_text(json.dumps(jobs))
            try:
                proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(spec)],
                                      capture_output=True, text=True, timeout=300,
                                      preexec_fn=_cap, cwd=sandbox)
                lines, died = proc.stdout.splitlines(), proc.returncode != 0
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout or b""
                lines = (out.decode() if isinstance(out, bytes) else out).splitlines()
                died = True
            done = [json.loads(line) for line in lines if line.startswith("{")]
            counts = by_command.setdefault(command, [0, 0])
            for r in done:
                tally["inputs"] += 1
                counts[0] += 1
                err_lines = r["err"].strip().splitlines()
                traceback_ = "Traceback" in r["err"]
                tally["tracebacks"] += traceback_
                one_line = (r["code"] == 2 and len(err_lines) == 1
                            and err_lines[0].startswith("error: "))
                if not one_line or r["seconds"] > MAX_SECONDS or r["peak"] > MAX_PEAK:
                    tally["damage"] += 1
                    bad.append(f"{r['label']}: exit {r['code']}, {r['seconds']:.1f} s, "
                               f"{r['peak'] / MIB:.0f} MiB, {err_lines[-1:] or ''}")
                else:
                    counts[1] += 1
                worst_peak = max(worst_peak, r["peak"])
                if r["seconds"] > worst_s:
                    worst_s, slowest = r["seconds"], r["label"]
            if died:  # the inputs it never reported: each a blow-up
                lost = len(jobs) - len(done)
                tally["inputs"] += lost
                tally["damage"] += lost
                tally["tracebacks"] += lost
                counts[0] += lost
                bad.append(f"{command}: the child died after {len(done)} of {len(jobs)} inputs")
    for command, (n, ok) in by_command.items():
        print(f"- `{command}`: {ok} of {n} inputs one `error:` line, exit 2")
    print(f"- shapes: {', '.join(BOMBS)} (each file under 1 KB but `wide`, 12 KB); "
          f"fields per command: study {len(STUDY_FIELDS)}, plan file {len(PLAN_FIELDS)}")
    print(f"- slowest input {worst_s:.2f} s (`{slowest}`), most memory {worst_peak / MIB:.1f} "
          f"MiB peak Python memory (counted as damage past {MAX_SECONDS:.0f} s or "
          f"{MAX_PEAK // MIB} MiB)")
    print(f"- inputs {tally['inputs']}, tracebacks {tally['tracebacks']}, "
          f"damage {tally['damage']}")
    for line in bad[:10]:
        print(f"  - {line}")
    return {"inputs": tally["inputs"], "tracebacks": tally["tracebacks"],
            "damage": tally["damage"]}


# ---- processes measured ------------------------------------------------------------------------

# The command under measurement records its own peak resident memory at exit (VmHWM of its own
# address space, which exec starts afresh): the rusage a parent reads back (ru_maxrss) keeps the
# high-water mark of the forked parent's pages from before the exec, so a command started by a
# large process would be charged that process's size.
_MEASURED = """
import atexit, os, runpy, sys
def _hwm():
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(os.environ["TCF_BENCH_HWM"], "w") as out:
        out.write(kib)
atexit.register(_hwm)
sys.argv = ["tcf-search", *sys.argv[1:]]
runpy.run_module("tcf_search", run_name="__main__", alter_sys=True)
"""


def measured(argv: list[str], cwd: Path, timeout_s: float, cap: bool = True
             ) -> tuple[int, str, float, int]:
    """Exit code, stderr, wall seconds and peak RSS bytes of ``tcf-search ARGV`` (its own
    VmHWM; the rusage figure where it died before writing it)."""
    with tempfile.TemporaryDirectory() as box:
        hwm = Path(box) / "hwm"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TCF_BENCH_HWM": str(hwm)}
        t0 = time.perf_counter()
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen([sys.executable, "-c", _MEASURED, *argv], cwd=cwd, env=env,
                                    stdout=subprocess.DEVNULL, stderr=err,
                                    preexec_fn=_cap if cap else None)
            deadline = t0 + timeout_s
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.05)
            proc.returncode = os.waitstatus_to_exitcode(status)
            err.seek(0)
            text = err.read()
        peak = int(hwm.read_text()) * 1024 if hwm.exists() else usage.ru_maxrss * 1024
    return proc.returncode, text, time.perf_counter() - t0, peak


# ---- 2. the memory screen's budget -------------------------------------------------------------

HUGE = ("name: {name}\nmodel:\n  architecture: {{layers: {layers}, hidden: 8192, "
        "ffn_hidden: 28672, heads: 64, vocab: 128256}}\ntraining: {{seq_len: 4096, "
        "global_batch: {gpus}}}\ncluster: {{gpu: h100-sxm-80gb, gpus: {gpus}}}\n")
HUGE_CASES = [(4096, 2**20), (2048, 2**20), (4096, 3 * 2**16)]


def table_budget() -> dict[str, int]:
    print("\n## The memory screen's budget (layouts x layers)\n")
    tally: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for layers, gpus in HUGE_CASES:
            study = Path(tmp) / f"l{layers}-g{gpus}.yaml"
            study.write_text(HUGE.format(name=study.stem, layers=layers, gpus=gpus))
            code, err, seconds, rss = measured(["run", str(study), "-o", f"{tmp}/out"],
                                               Path(tmp), 120)
            lines = err.strip().splitlines()
            ok = code == 2 and len(lines) == 1 and "over the budget" in lines[0]
            tally["inputs"] += 1
            tally["tracebacks"] += "Traceback" in err
            tally["damage"] += (not ok) + Path(f"{tmp}/out").exists()
            print(f"- {layers:,} layers on {gpus:,} GPUs: exit {code} in {seconds:.1f} s, "
                  f"peak RSS {rss / MIB:.0f} MiB: `{lines[-1][:150] if lines else ''}...`")
    return dict(tally)


# ---- 3. predict on a long CSV ------------------------------------------------------------------

HEADER = ("case_id,model_name,layers,hidden,ffn_hidden,heads,kv_heads,vocab,seq_len,ffn_type,"
          "tied_embeddings,moe_experts,moe_topk,moe_ffn_hidden,moe_shared_experts,gpu,"
          "gpus_per_node,num_gpus,tp,pp,vpp,cp,ep,dp,zero_stage,micro_batch,global_batch,"
          "recompute,sequence_parallel,precision,framework,tokens_per_sec_per_gpu,notes")
ROWS = [",llama 8B,32,4096,14336,32,8,128256,8192,swiglu,false,,,,,h100-sxm-80gb,8,64,2,2,1,1,1,"
        "16,1,1,512,selective,true,bf16,megatron,",
        ",mixtral,32,4096,14336,32,8,32000,4096,swiglu,false,8,2,14336,0,h100-sxm-80gb,8,64,1,4,1,"
        "1,8,16,1,1,256,full,false,bf16,megatron,",
        ",llama 70B,80,8192,28672,64,8,128256,8192,swiglu,false,,,,,h100-sxm-80gb,8,64,8,2,,1,1,"
        "4,1,,256,,true,bf16,nemo,"]


def _csv(path: Path, rows: int, notes: bool) -> None:
    """A sweep: each row its own case_id and measured tokens/s (columns predict does not read);
    with ``notes``, each its own note too (read, for a fabric, but naming none)."""
    with path.open("w") as f:
        f.write(HEADER + "\n")
        for i in range(rows):
            note = f"sweep row {i}" if notes else ""
            f.write(f"case-{i:09d}{ROWS[i % len(ROWS)]}{3000 + i % 997}.5,{note}\n")


def _check(out: Path, rows: int) -> tuple[int, int]:
    """Rows lost and rows written twice, by case_id."""
    seen: Counter[str] = Counter()
    with out.open() as f:
        next(f)
        for line in f:
            seen[line.partition(",")[0]] += 1
    lost = sum(1 for i in range(rows) if f"case-{i:09d}" not in seen)
    return lost, sum(n - 1 for n in seen.values() if n > 1)


def _predict_run(tally: Counter[str], tmp: Path, rows: int, notes: bool) -> None:
    src, dst = tmp / f"cases-{rows}-{notes}.csv", tmp / f"out-{rows}-{notes}.csv"
    _csv(src, rows, notes)
    size = src.stat().st_size
    code, err, seconds, rss = measured(["predict", str(src), "-o", str(dst)], tmp, 3600,
                                       cap=False)
    lost, twice = _check(dst, rows) if dst.is_file() else (rows, 0)
    src.unlink()
    tally.update(inputs=1, tracebacks="Traceback" in err, damage=code != 0, lost=lost,
                 duplicates=twice)
    what = "every note different" if notes else "3 distinct inputs"
    print(f"- {rows:,} rows, {size / MIB:.0f} MiB ({size / rows:.0f} bytes a row; {what}): exit "
          f"{code}, {seconds:.1f} s, peak RSS {rss / MIB:.0f} MiB ({rss / size:.1f}x the file), "
          f"rows lost {lost}, written twice {twice}")


def long_predict(quick: bool) -> dict[str, int]:
    rows = 10**5 if quick else 10**6
    print(f"\n## predict on a long CSV ({rows:,} rows{'; --quick' if quick else ''})\n")
    tally: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        _predict_run(tally, Path(tmp), rows, notes=False)
        if quick:
            return dict(tally)
        _predict_run(tally, Path(tmp), 10**5, notes=True)
        if MEASURED.is_file():
            code, err, seconds, rss = measured(["predict", str(MEASURED), "-o",
                                                f"{tmp}/measured.csv"], Path(tmp), 1800,
                                               cap=False)
            tally.update(inputs=1, tracebacks="Traceback" in err, damage=code != 0)
            print(f"- measured_runs.csv (4,537 rows, 3.7 MiB): exit {code}, {seconds:.1f} s, "
                  f"peak RSS {rss / MIB:.0f} MiB")
    return dict(tally)


def section(quick: bool) -> dict[str, int]:
    total: Counter[str] = Counter()
    for part in (alias_bombs(), table_budget(), long_predict(quick)):
        total.update(part)
    keys = ("inputs", "faults", "tracebacks", "damage", "lost", "duplicates")
    print(f"\n**bounds:** {', '.join(f'{k} {total[k]}' for k in keys)}")
    return {k: int(total[k]) for k in keys}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10**5 predict rows, not 10**6")
    section(parser.parse_args().quick)
