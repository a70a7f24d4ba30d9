"""Screenshots for issue 6, and how long each command takes.

    python benchmarks/bench_report.py [OUT_DIR]      # default /tmp/tcf-screens

Writes: ``report-70b.png`` (the HTML report of the 70B study in headless Chromium) and its
figure PNGs, ``explain-70b-best.png`` (explain of the best plan), ``compare-70b.png`` (the
trade-off table: recompute, TP, PP, ZeRO-3, CP from one base that fits),
``nightly-two-nights.png`` (night 2 flags the plan of night 1 that no longer fits after a
catalog change), and ``timings.json``.
Terminal output is recorded by rich as SVG and rasterised by Chromium (matplotlib text when no
Chromium is installed).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.markdown import Markdown

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search.inputs.specs import build_specs  # noqa: E402
from search.inputs.study import load_study  # noqa: E402
from search.pipeline import RunOptions, run_study  # noqa: E402
from tcf_search.compare import compare  # noqa: E402
from tcf_search.compare import render as render_compare  # noqa: E402
from tcf_search.explain import explain, parse_plan, resolve  # noqa: E402
from tcf_search.explain.render import render as render_explain  # noqa: E402
from tcf_search.nightly import run_night  # noqa: E402
from tcf_search.report import build_report  # noqa: E402

STUDY_70B = ROOT / "studies" / "llama3-70b-h100x64.yaml"
STUDY_8B = ROOT / "studies" / "llama3-8b-h100x8.yaml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


def timed(timings: dict[str, float], name: str, fn: Callable[[], object]) -> object:
    start = time.perf_counter()
    out = fn()
    timings[name] = round(time.perf_counter() - start, 3)
    return out


def screenshot(page: Path, png: Path, width: int, height: int) -> None:
    assert CHROMIUM is not None
    subprocess.run([CHROMIUM, *CHROME_ARGS, f"--window-size={width},{height}",
                    f"--screenshot={png}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=180)


def terminal_png(draw: Callable[[Console], None], png: Path, width: int = 130) -> None:
    """Rich output as PNG: SVG through Chromium, or plain text through matplotlib."""
    con = Console(record=True, width=width, file=io.StringIO(), force_terminal=True,
                  highlight=False)
    draw(con)
    if CHROMIUM is not None:
        svg = con.export_svg(title=png.stem)
        box = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
        assert box is not None
        w, h = (int(float(v)) + 1 for v in box.groups())
        page = png.with_suffix(".html")
        page.write_text(f"<html><body style='margin:0;background:#fff'>{svg}</body></html>")
        screenshot(page, png, w, h)
        page.unlink()
        return
    from matplotlib.figure import Figure

    text = con.export_text()
    lines = text.count("\n") + 1
    fig = Figure(figsize=(width * 0.075, lines * 0.16 + 0.3))
    fig.text(0.01, 0.99, text, family="monospace", fontsize=8, va="top")
    fig.savefig(png, dpi=120)


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        result = tmp / "llama3-70b-h100x64"
        timed(timings, "run_70b_s", lambda: run_study(load_study(STUDY_70B),
                                                      RunOptions(out_dir=result)))
        timed(timings, "report_70b_s",
              lambda: build_report(result, result / "report.html", out / "report-figures"))
        if CHROMIUM is not None:
            timed(timings, "chromium_screenshot_s",
                  lambda: screenshot(result / "report.html", out / "report-70b.png", 1200, 5200))
        shutil.copy(result / "report.html", out / "report-70b.html")

        doc = timed(timings, "explain_best_s", lambda: explain(resolve(result, None, None)))
        terminal_png(lambda con: render_explain(doc, con), out / "explain-70b-best.png")  # type: ignore[arg-type]
        (out / "explain-70b-best.json").write_text(json.dumps(doc, indent=2))

        specs = build_specs(load_study(STUDY_70B))
        base = parse_plan("tp=4,pp=4,mbs=1,recompute=selective,zero=1,sp=true", specs)
        techniques = ["recompute=full", "tp=8", "pp=8", "zero=3", "cp=2"]
        table = timed(timings, "compare_s", lambda: compare(specs, base, techniques))
        terminal_png(lambda con: render_compare(table, con), out / "compare-70b.png",  # type: ignore[arg-type]
                     width=150)
        (out / "compare-70b.json").write_text(json.dumps(table, indent=2, default=str))

        studies = tmp / "studies"
        studies.mkdir()
        hist = tmp / "history"
        doc8 = yaml.safe_load(STUDY_8B.read_text())
        (studies / STUDY_8B.name).write_text(yaml.safe_dump(doc8))
        skus = ["h100-sxm-80gb", "a100-sxm-80gb"]
        timed(timings, "nightly_night1_s", lambda: run_night(
            [studies / STUDY_8B.name], skus, hist, "2025-01-01", trials=20))
        # Night 2: the catalog learns that the driver reserves 20 GiB more of each GPU.
        doc8["cluster"]["overrides"] = {"memory_reserve_bytes": 20 * 2**30}
        (studies / STUDY_8B.name).write_text(yaml.safe_dump(doc8))
        night2 = timed(timings, "nightly_night2_s", lambda: run_night(
            [studies / STUDY_8B.name], skus, hist, "2025-01-02", trials=20))
        summary = (hist / "2025-01-02" / "summary.md").read_text()
        terminal_png(lambda con: con.print(Markdown(summary)), out / "nightly-two-nights.png",
                     width=150)
        (out / "nightly-summary-2025-01-02.md").write_text(summary)
        (out / "nightly-results.csv").write_text((hist / "results.csv").read_text())
        timings["nightly_regressions"] = len(night2.regressions)  # type: ignore[attr-defined]
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(json.dumps(timings, indent=2))
    print(f"screenshots in {out}" + ("" if CHROMIUM else " (no chromium: report page not shot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/tcf-screens")))
