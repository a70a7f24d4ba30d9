"""Figures for generated files as code (issue 39, item 1): run
``python benchmarks/robust_exports.py [--quick]``.

Hostile texts (tests/export_formats.py's breakers: the issue's model name, a PEP 263 coding
cookie, shell, Python, TOML, YAML and JSON breakers, line separators, controls, surrogates; and,
outside quick mode, random texts mixing them with arbitrary code points) go into every field a
study, a plan file, a Hugging Face config or an export option carries: all free-text fields at
once (with and without a run name) and each checked option alone, on every exporter and every
file format it writes. Each rendering is one input, rendered in this process, and every file is
read back by its format's own parser (``ast`` from the bytes, ``tomllib``, ``yaml.safe_load``,
``json.loads``, ``shlex`` and the ``#SBATCH`` lines) against a benign rendering. Damage: a file
that does not parse, that holds anything but the text as data (an extra call, statement, key,
word or directive; a text that does not round-trip), an error message of more than one line, or
a file created in the working directory. Tracebacks: any other exception.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import export_formats as ef  # noqa: E402

RANDOM_TEXTS = 400
POOLS = [
    [chr(c) for c in range(0x20, 0x7F)],
    [chr(c) for c in (*range(0x00, 0x20), 0x7F, 0x85, 0x2028, 0x2029, 0xFEFF)],
    [chr(c) for c in range(0x202A, 0x202F)] + [chr(0xD800), chr(0xDFFF)],
    ['"', "'", "\\", "#", "$", "`", ";", "\n", "{", "}", "[", "]", ":", "&", "*", "!"],
]


def random_text(rng: random.Random) -> str:
    """Up to 40 code points from the pools (or anywhere in Unicode), perhaps around a breaker."""
    chars = [rng.choice(rng.choice(POOLS)) if rng.random() < 0.8
             else chr(rng.randrange(0x110000)) for _ in range(rng.randint(1, 40))]
    text = "".join(chars)
    if rng.random() < 0.4:
        cut = rng.randint(0, len(text))
        text = text[:cut] + rng.choice(ef.BREAKERS) + text[cut:]
    return text


def texts(quick: bool, seed: int) -> list[str]:
    rng = random.Random(seed)
    return list(ef.BREAKERS) + ([] if quick else [random_text(rng) for _ in range(RANDOM_TEXTS)])


def section(quick: bool) -> dict[str, int]:
    seed = int(time.time())
    hostile = texts(quick, seed)
    print("\n## Generated files as code: hostile text in every field of every export format\n")
    kinds: Counter[str] = Counter()
    files: Counter[str] = Counter()
    failures: list[str] = []
    tracebacks = 0
    t0 = time.perf_counter()
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # a payload that ran would leave its file here
        try:
            for text in hostile:
                for target in ef.TARGETS:
                    for fields in ef.cases(target):
                        try:
                            kind, found = ef.outcome(target, text, fields)
                        except Exception:  # noqa: BLE001 (counted: a traceback)
                            tracebacks += 1
                            failures.append(f"traceback {target.label} {fields} {text[:40]!r}: "
                                            f"{traceback.format_exc(limit=2)[-300:]}")
                            continue
                        kinds[kind] += 1
                        if kind == "written":
                            files.update(Path(name).suffix
                                         for name in ef.benign_files(target, fields))
                        if found:
                            failures.append(f"damage {target.label} {fields} {text[:40]!r}: "
                                            f"{found[:2]}")
            created = sorted(p.name for p in Path(tmp).iterdir())
        finally:
            os.chdir(here)
    wall = time.perf_counter() - t0
    inputs = sum(kinds.values()) + tracebacks
    damage = kinds["damage"] + len(created)
    print(f"- {len(hostile):,} hostile texts ({len(ef.BREAKERS)} fixed breakers"
          f"{'' if quick else f', {RANDOM_TEXTS} random (seed {seed})'}) × "
          f"{len(ef.TARGETS)} exporter targets × their field sets: {inputs:,} renderings, "
          f"{wall:.0f} s")
    per_format = ", ".join(f"{n:,} {suffix}" for suffix, n in sorted(files.items()))
    print(f"- written and read back as data: {kinds['written']:,} renderings, "
          f"{sum(files.values()):,} files ({per_format}); refused in one line: "
          f"{kinds['refused']:,}")
    print(f"- files that did not parse or held more or less than the text as data: "
          f"{kinds['damage']}; files a payload created: {len(created)}; tracebacks: "
          f"{tracebacks}")
    for line in failures[:10]:
        print(f"  - {line}")
    return {"inputs": inputs, "faults": 0, "tracebacks": tracebacks, "damage": damage,
            "lost": 0, "duplicates": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the fixed breakers only")
    print(section(parser.parse_args().quick))


if __name__ == "__main__":
    main()
