"""Hostile text in every field that reaches a generated file, and the check that each file still
reads, with its format's own parser, as exactly what a benign text gives with the hostile text in
its place: a ``.py`` through ``ast`` (bytes, as the importer decodes them), ``.toml`` through
``tomllib``, ``.yaml`` through ``yaml.safe_load``, ``.json`` through ``json.loads``, scripts
through ``shlex`` (and their ``#SBATCH`` lines). The benign text is a marker per field; swapping
each marker for the hostile text in the benign parse gives the one parse the hostile file may
have, so one extra call, statement, key, word or line is caught, and so is a text that does not
round-trip. Shared by tests/test_robust_export_formats.py and benchmarks/robust_exports.py."""

from __future__ import annotations

import ast
import dataclasses
import functools
import io
import json
import re
import shlex
import tempfile
import tokenize
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from search.planfile import PlanFile, load_plan_file
from search.presets import get_preset
from tcf_search.export import ExportError, ExportOptions, ExportRefused, render, write_exports

PLANS = Path(__file__).resolve().parent / "golden" / "export" / "plans"

REPRO = 'a"""; __import__("os").system("touch pwned"); """'  # issue 39, item 1, verbatim
# PEP 263 reads a coding cookie from a comment on the first two lines; in UTF-7 "+AAo-" is a
# newline and "+ACI-" a double quote, so an importer would decode this into a statement
COOKIE = ("x -*- coding: utf-7 -*- +AAo-__import__(+ACI-os+ACI-).system(+ACI-touch pwned+ACI-)"
          "+AAo-#")
BREAKERS = [
    REPRO, COOKIE, "'''; __import__('os').system('touch pwned'); '''",
    "x\nimport os; os.system('touch pwned')", "x\r__import__('os').system('touch pwned')",
    "x\r\n#", "a\u2028b", "a\u2029b", "a\x85b", "a\x0bb", "a\x0cb", "a\x1cb", "\x00", "\x7f",
    "\x1b[31m", "\u202eevil", "\u200b", "\ufeff", "\ud800", "\U0001f600", "\\", '\\"', "\\N{X}",
    "\\x41\\u0041", "{0}{x}%s", "f'{__import__(\"os\")}'", "#", "\\\n#", '"', "'", '"""', "'''",
    "$(touch pwned)", "`touch pwned`", "; touch pwned", "| touch pwned", "&& touch pwned",
    "${IFS}touch${IFS}pwned", "' ; touch pwned ; '", "\n#SBATCH --uid=0",
    '"\n[job]\ndump_folder = "/"', "a = 1", "[[x]]", "]]", "\"\"\"\n[x]",
    "!!python/object/apply:os.system ['touch pwned']", "&a [*a, *a]", "--- \n...", "key: value",
    "- item", "? x", "@x", "%YAML 1.1", "*alias", '"}, "x": {"', "NaN", "Infinity", "null",
    "true", "0x10", "1e400", "\u0663:\u0660\u0660", "llama3", "a" * 5000, " ", "\t",
]

PLAN_FIELDS = ("study", "gpu", "model.name")
# options a launcher takes as any text: each is a quoted word, a string or a comment
FREE_OPTIONS = ("run_name", "megatron_script", "nemo_script", "nemo_recipe", "train_script",
                "nanotron_script", "titan_flavor")
FREE = PLAN_FIELDS + FREE_OPTIONS
# options a launcher reads as a name or a number: refused unless the text is one
CHECKED = ("titan_module", "titan_config", "slurm_partition", "slurm_account", "slurm_time",
           "slurm_launcher", "target_version")
# a checked option's text on an #SBATCH line: sbatch splits the line into words itself
DIRECTIVES = ("slurm_partition", "slurm_account", "slurm_time")
# options that choose among a few values: accepted text must be one of them
ENUMERATED = {
    "slurm_launcher": re.compile("megatron|nemo|deepspeed|torchtitan|nanotron|accelerate"),
    "target_version": re.compile(r"[A-Za-z0-9.=,\s]*")}
# markers the benign files hold where a field's text goes (valid wherever the field is checked)
MARKERS = {field: f"tcfmark{i:02d}" for i, field in enumerate(FREE + CHECKED)
           if field not in ENUMERATED}
MARKERS["slurm_time"] = "12:34:56"
_PLAIN = re.compile(r"[A-Za-z0-9._,:-]+")
_JOB = re.compile(r"#SBATCH --job-name=([A-Za-z0-9._-]{1,64})")


@dataclass(frozen=True, slots=True)
class Target:
    plan: str
    fmt: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.options)
        return f"{self.fmt}[{self.plan}{',' + extra if extra else ''}]"


# every exporter and every file it writes, at least once: the 0.3 .py with and without a
# pipeline, the 0.2 .toml, both YAMLs, both JSONs, every launch script (the sbatch exports
# include the megatron, nanotron and torchtitan 0.2 ones) and the sbatch
TARGETS = (
    Target("fsdp8b", "nemo"), Target("fsdp8b", "deepspeed"), Target("fsdp8b", "torchtitan"),
    Target("pp8b", "torchtitan"), Target("fsdp8b", "accelerate"),
    Target("fsdp8b", "slurm", (("slurm_partition", "gpu"), ("slurm_account", "a-1"))),
    Target("pp8b", "slurm", (("slurm_launcher", "nanotron"),)),
    Target("llama31-70b", "slurm", (("slurm_launcher", "torchtitan"),
                                    ("target_version", "torchtitan=0.2"))),
)


@functools.cache
def plans() -> dict[str, PlanFile]:
    out = {p.stem: load_plan_file(p) for p in sorted(PLANS.glob("*.yaml"))}
    # Llama 3.1 70B, which torchtitan 0.2's flavour table holds (export_plans.seventy_b)
    seventy = out["dense70b"]
    out["llama31-70b"] = dataclasses.replace(
        seventy, model=get_preset("llama3.1-70b"),
        plan=dataclasses.replace(seventy.plan, recompute="selective"))
    return out


def files_of(target: Target, values: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The target's files with each field of ``values`` holding its text."""
    pf = plans()[target.plan]
    options = dict(target.options)
    for field, text in values:
        if field == "study":
            pf = dataclasses.replace(pf, study=text)
        elif field == "gpu":
            pf = dataclasses.replace(pf, gpu=text)
        elif field == "model.name":
            pf = dataclasses.replace(pf, model=dataclasses.replace(pf.model, name=text))
        else:
            options[field] = text
    return render(target.fmt, pf, ExportOptions(**options))  # type: ignore[arg-type]


@functools.lru_cache(maxsize=256)
def benign_files(target: Target, fields: tuple[str, ...]) -> dict[str, str]:
    return files_of(target, tuple((f, MARKERS[f]) for f in fields if f in MARKERS))


def reads(target: Target, field: str) -> bool:
    """Whether the target's files can depend on the field (a checked option is fuzzed where
    it is read: the titan options by torchtitan, the slurm ones by the sbatch export)."""
    if field.startswith("titan_"):
        return "torchtitan" in (target.fmt, dict(target.options).get("slurm_launcher"))
    return not field.startswith("slurm_") or target.fmt == "slurm"


def cases(target: Target) -> list[tuple[str, ...]]:
    """The field sets a hostile text goes into on this target: every free field at once (with
    and without a run name, whose absence sends the study name where the run name goes), and
    each checked option the target reads on its own."""
    free = tuple(f for f in FREE if reads(target, f))
    return [free, tuple(f for f in free if f != "run_name"),
            *[(f,) for f in CHECKED if reads(target, f)]]


def _swap(text: str, swaps: dict[str, str]) -> str:
    for marker, hostile in swaps.items():
        text = text.replace(marker, hostile)
    return text


def _swapped(doc: Any, swaps: dict[str, str]) -> Any:
    if isinstance(doc, str):
        return _swap(doc, swaps)
    if isinstance(doc, list | tuple):
        return type(doc)(_swapped(v, swaps) for v in doc)
    if isinstance(doc, dict):
        return {_swapped(k, swaps): _swapped(v, swaps) for k, v in doc.items()}
    return doc


def python_tree(text: str) -> ast.Module:
    """The module as ``import`` reads it: its bytes, decoded by their coding cookie if any."""
    raw = text.encode("utf-8")
    encoding = tokenize.detect_encoding(io.BytesIO(raw).readline)[0]
    if encoding != "utf-8":
        raise ValueError(f"a comment on its first lines makes Python decode it as {encoding}")
    return ast.parse(raw)


def _python(text: str) -> tuple[str, list[str], set[str]]:
    """The module's shape (its AST with every text blanked), its texts in walk order (constants,
    names, attributes, imported modules) and the names it uses."""
    tree = python_tree(text)
    texts: list[str] = []
    for node in ast.walk(tree):
        for name, value in ast.iter_fields(node):
            if isinstance(value, str):
                texts.append(value)
                setattr(node, name, "")
    names = {t for t in texts if t.isidentifier()}
    return ast.dump(tree), texts, names


def _script(text: str) -> dict[str, list[str]]:
    """The words a shell runs (comments dropped) and the ``#SBATCH`` directives sbatch reads
    (those before the first command), the job name (a label sanitised to [A-Za-z0-9._-], see
    export/slurm.py) checked and set aside."""
    directives = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            break  # sbatch reads directives up to the first command
        if line.startswith("#SBATCH"):
            if line.startswith("#SBATCH --job-name="):
                if not _JOB.fullmatch(line):
                    raise ValueError(f"job name is not sanitised: {line!r}")
                line = "#SBATCH --job-name=..."
            directives.append(line)
    return {"words": shlex.split(text, comments=True), "directives": directives}


_YAML = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # safe either way; C is faster
READERS = {".py": _python, ".toml": tomllib.loads, ".json": json.loads,
           ".yaml": lambda text: yaml.load(text, Loader=_YAML),
           ".sh": _script, ".sbatch": _script}
# names a payload would call to run code; a generated .py must hold none the benign one lacks
CODE_NAMES = {"__import__", "os", "system", "exec", "eval", "compile", "open", "subprocess",
              "getattr", "globals", "breakpoint", "pwned"}


def read(name: str, text: str) -> Any:
    return READERS[Path(name).suffix](text)


@functools.lru_cache(maxsize=256)
def _benign_read(target: Target, fields: tuple[str, ...]) -> dict[str, Any]:
    return {name: read(name, text) for name, text in benign_files(target, fields).items()}


def problems(benign: dict[str, Any], hostile: dict[str, str], swaps: dict[str, str]
             ) -> list[str]:
    """What is wrong with the hostile files, given the benign ones as read (empty: each reads
    as the benign one, with the hostile text in the markers' places)."""
    if sorted(benign) != sorted(hostile):
        return [f"files {sorted(hostile)}, expected {sorted(benign)}"]
    out = []
    for name, text in hostile.items():
        try:
            got = read(name, text)
        except (SyntaxError, ValueError, tomllib.TOMLDecodeError, yaml.YAMLError) as e:
            out.append(f"{name} does not parse: {str(e)[:200]}")
            continue
        want = _swapped(benign[name], swaps)
        if name.endswith(".py"):
            if extra := (got[2] & CODE_NAMES) - benign[name][2]:
                out.append(f"{name} names {sorted(extra)}: code")
            got, want = got[:2], want[:2]
        if got != want:
            out.append(f"{name} holds something else than the text as data")
    return out


def one_line(message: str) -> bool:
    return len(message.splitlines()) == 1 and all(c.isprintable() for c in message)


def _writer_refuses(files: dict[str, str]) -> bool:
    """The writer refuses, in one line and writing nothing, text no UTF-8 file can hold (a
    lone surrogate)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        try:
            write_exports(files, out)
        except ExportError as e:
            return one_line(str(e)) and not (out.exists() and any(out.iterdir()))
    return False


def outcome(target: Target, text: str, fields: Iterable[str]) -> tuple[str, list[str]]:
    """``text`` in each of ``fields`` of ``target``: ("written", []) when every file reads as
    the benign ones with the text as data; ("refused", []) for one line of error (a checked
    option, a plan the launcher refuses, a text no file can hold); ("damage", problems)
    otherwise. Anything else raised is a traceback, and propagates."""
    fields = tuple(fields)
    try:
        hostile = files_of(target, tuple((f, text) for f in fields))
    except (ExportError, ExportRefused) as e:
        if one_line(str(e)):
            return "refused", []
        return "damage", [f"an error of {len(str(e).splitlines())} lines: {str(e)[:200]!r}"]
    if bad := [f for f in fields if f in ENUMERATED and reads(target, f)
               and not ENUMERATED[f].fullmatch(text)]:
        return "damage", [f"{bad} accepted {text!r}"]
    if bad := [f for f in fields if f in DIRECTIVES and reads(target, f)
               and not _PLAIN.fullmatch(text)]:
        return "damage", [f"{bad} accepted {text!r} for an #SBATCH line"]
    if any(f in ENUMERATED for f in fields):
        return "written", []  # one of a few values, each a file set of its own
    try:
        "".join(hostile.values()).encode("utf-8")
    except UnicodeEncodeError:
        return ("refused", []) if _writer_refuses(hostile) else (
            "damage", ["the writer took text that is not valid Unicode"])
    found = problems(_benign_read(target, fields), hostile, {MARKERS[f]: text for f in fields})
    return ("damage", found) if found else ("written", [])
