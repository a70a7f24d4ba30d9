"""The report fits the page (issue #38): rendered in headless Chromium at 1,400 and 1,000 px,
no table, figure or the body is wider than its box (``scrollWidth > clientWidth`` read from the
DOM), and the memory chart's x labels do not overlap."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from search.inputs.study import load_study
from search.pipeline import RunOptions, run_study
from tcf_search.cli import main
from tcf_search.report.data import load_result
from tcf_search.report.plots import memory_bars

STUDY = Path(__file__).resolve().parents[1] / "studies" / "llama3-70b-h100x1024.yaml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# appended to a copy of the page: what overflows, written where --dump-dom shows it
PROBE = """<script>
const over = e => e.scrollWidth > e.clientWidth + 1;
const bad = [];
if (over(document.documentElement)) bad.push('html');
if (over(document.body)) bad.push('body');
const right = document.body.getBoundingClientRect().right;
document.querySelectorAll('table, figure, pre').forEach((e, i) => {
  if (over(e) || e.getBoundingClientRect().right > right + 1)
    bad.push(e.tagName + '#' + (e.id || i) + ':' + e.scrollWidth + '>' + e.clientWidth);
});
const p = document.createElement('pre'); p.id = 'overflow-probe';
p.textContent = 'OVERFLOW=' + JSON.stringify(bad); document.body.appendChild(p);
</script>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 70B study's report, with its baseline (the long plan strings of issue #38)."""
    out = tmp_path_factory.mktemp("lay")
    run_study(load_study(STUDY), RunOptions(out_dir=out, trials=12))
    assert json.loads((out / "result.json").read_text())["baseline"] is not None
    html = out / "report.html"
    assert main(["report", str(out), "-o", str(html), "--no-png"]) == 0
    return out


@pytest.mark.parametrize("width", [1400, 1000])
def test_nothing_overflows_the_page_in_chromium(page: Path, tmp_path: Path, width: int) -> None:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: apt-get install -y chromium to check the layout")
    probe = tmp_path / "probe.html"
    probe.write_text((page / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    got = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={width},2000", "--virtual-time-budget=5000", "--dump-dom",
         probe.resolve().as_uri()], capture_output=True, text=True, timeout=120, check=True)
    found = re.search(r"OVERFLOW=(\[.*?\])", got.stdout)
    assert found, got.stdout[-2000:] + got.stderr[-2000:]
    assert json.loads(found.group(1).replace("&quot;", '"')) == []


def test_memory_chart_x_labels_do_not_overlap(page: Path) -> None:
    fig = memory_bars(load_result(page))
    assert fig is not None
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    boxes = [t.get_window_extent(canvas.get_renderer())
             for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert len(boxes) >= 5
    for a, b in zip(boxes, boxes[1:], strict=False):
        assert a.x1 <= b.x0, (a, b)
