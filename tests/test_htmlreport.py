"""htmlreport: the grid and the cell pages, from verdict.json + JUnit properties; and in a real browser.

The reports are small synthetic reports/ folders (see test_history.write_cell) carrying the properties the
suites record: 10-capability's findings and grid, the runner's patch statuses, 20-eagle3's contract,
equivalence figures (issue 7's names) and throughput figures with a threshold (held as JUnit properties only:
those families' format 0, stackfarm.family.SuiteFamily.legacy).
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import cell_report
from stackfarm import history, htmlreport, verdict
from test_history import CELL, OTHER, CaseSpec, write_cell

FAILING: dict[str, list[CaseSpec]] = {
    "00-patches": [
        ("sm120-capability/0001-all-reduce.patch", "passed", "", {"patch.sm120-capability/0001-all-reduce.patch.status": "applied"}),
        ("kimi-k25-eagle3/0001-hooks.patch", "failed", "drift: hunk 2", {"patch.kimi-k25-eagle3/0001-hooks.patch.status": "drift"}),
    ],
    "10-capability": [
        ("test_finding[table-sm_120-torch_symm_mem]", "failed", "KeyError: 12 <script>alert(1)</script>",
         {"arch": "sm_120", "component": "sglang", "verdict": "missing-key", "file": "torch_symm_mem.py", "line": "40"}),
        ("test_finding[table-sm_90-torch_symm_mem]", "passed", "",
         {"arch": "sm_90", "component": "sglang", "verdict": "ok", "file": "torch_symm_mem.py", "line": "40"}),
    ],
    "20-eagle3": [("test_runtime[Kimi]", "skipped", "needs GPU: no NVIDIA GPU", {})],
}  # fmt: skip
PASSING: dict[str, list[CaseSpec]] = {
    "00-patches": [("sm120-capability/0001-all-reduce.patch", "passed", "", {})],
    "10-capability": [("test_finding[table-sm_90]", "passed", "", {"arch": "sm_90", "verdict": "ok"})],
    "20-eagle3": [
        ("test_contract", "passed", "", {"sglang": "0.5.15", "contract": "target.get_embed_and_head  <- eagle_worker.py:88"}),
        ("test_provider[target:KimiK25.get_embed_and_head]", "passed", "",
         {"model_class": "KimiK25ForConditionalGeneration", "method": "get_embed_and_head", "verdict": "ok", "role": "target"}),
    ],
    "30-numerics": [
        ("test_e2e[eagle3-bf16]", "passed", "", {"match_rate": "0.5", "first_divergence": "4", "near_ties": "2",
                                                 "max_abs_err": "0", "tolerance": "0.05"}),
    ],
    "40-throughput": [
        ("test_figures", "passed", "", {"decode_tok_s.median": "92.6", "decode_tok_s.ci_low": "91.9",
                                        "decode_tok_s.ci_high": "93.1", "decode_tok_s.n": "5", "decode_tok_s.cv": "0.01",
                                        "eagle3_decode_tok_s.median": "54.1", "eagle3_decode_tok_s.n": "5"}),
        ("test_threshold[decode_tok_s]", "passed", "", {"name": "decode_tok_s", "figure": "decode_tok_s", "kind": "absolute",
                                                        "bound": ">= 89.5", "threshold": "89.5", "verdict": "pass", "median": "92.6"}),
    ],
}  # fmt: skip


def capability_record(cases: Sequence[CaseSpec], grid: Mapping[str, str] | None = None) -> dict[str, Any]:
    """10-capability's record (suites/10-capability/family.py) of the findings `cases` carry and the
    ``capability.<arch>.<component>`` grid, as the suite writes both."""
    findings = [
        {"testcase": name, "arch": p["arch"], "component": p.get("component", ""), "verdict": p["verdict"],
         "file": p.get("file", ""), "line": int(p.get("line", 0)), "symbol": p.get("symbol", ""),
         "detail": p.get("detail", "")}
        for name, _, _, p in cases
        if {"arch", "verdict"} <= p.keys()
    ]  # fmt: skip
    cells = [
        {"arch": key.split(".")[1], "component": key.split(".", 2)[2], "text": text}
        for key, text in (grid or {}).items()
    ]
    return {"grid": cells, "findings": findings}


#: The records the suites with a family write for FAILING and PASSING.
FAILING_RECORDS = {
    "10-capability": capability_record(
        FAILING["10-capability"],
        {"capability.sm_120.sglang": "missing-key x1", "capability.sm_90.sglang": "ok"},
    )
}
PASSING_RECORDS = {"10-capability": capability_record(PASSING["10-capability"])}


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    root = tmp_path / "reports"
    write_cell(
        root,
        CELL,
        FAILING,
        properties={"axis.sglang": "0.5.9", "sglang.version": "0.5.9", "sglang.sha256": "8a" * 32,
                    "patches.sm120-capability.sha256": "ff" * 32,
                    # the statuses the runner's patch step gives the verdict (CellReport.patches)
                    "patch.sm120-capability/0001-all-reduce.patch.status": "applied",
                    "patch.kimi-k25-eagle3/0001-hooks.patch.status": "drift"},
        suite_properties={"10-capability": {"capability.sm_120.sglang": "missing-key x1", "capability.sm_90.sglang": "ok"}},
        records=FAILING_RECORDS,
    )  # fmt: skip
    write_cell(root, OTHER, PASSING, properties={"axis.sglang": "0.5.15", "sglang.version": "0.5.15"},
               records=PASSING_RECORDS)  # fmt: skip
    return root


def _cells(page: str) -> dict[tuple[str, str], str]:
    """(row cell id, column index) -> outcome, from the grid's data attributes."""
    out = {}
    for row in re.findall(r'<tr data-cell="([^"]+)"[^>]*>(.*?)</tr>', page):
        for col, outcome in enumerate(re.findall(r'data-outcome="([a-z]+)"', row[1])):
            out[(row[0], str(col))] = outcome
    return out


def test_grid_colours_each_suite_and_links_each_cell(reports: Path) -> None:
    written = htmlreport.write(reports)
    assert written[0] == reports / "index.html"
    page = written[0].read_text()
    head = re.search(r"<thead>(.*?)</thead>", page)
    assert head is not None
    columns = re.findall(r"<th>([^<]+)</th>", head.group(1))
    assert columns == [
        "cell",
        "00-patches",
        "10-capability",
        "20-eagle3",
        "30-numerics",
        "40-throughput",
        "verdict",
    ]
    grid = _cells(page)
    assert [grid[(CELL, str(i))] for i in range(6)] == [
        "failed",
        "failed",
        "skipped",
        "missing",
        "missing",
        "failed",
    ]
    assert [grid[(OTHER, str(i))] for i in range(6)] == ["passed"] * 6
    assert f'href="{CELL}/index.html"' in page
    assert (reports / CELL / "index.html").is_file()
    assert "background:#1a7f37" in page
    assert "background:#cf222e" in page


def test_cell_page_shows_findings_patches_contract_equivalence_throughput(reports: Path) -> None:
    htmlreport.write(reports)
    failing = (reports / CELL / "index.html").read_text()
    assert "<h2>Capability findings</h2>" in failing
    assert "missing-key x1" in failing, "the arch x component grid from the record"
    assert "KeyError: 12 &lt;script&gt;" in failing
    assert "<script>" not in failing, "messages are escaped"
    assert re.search(
        r"kimi-k25-eagle3/0001-hooks\.patch</code></td><td><span class=\"badge o-failed\">drift", failing
    )
    assert "ffffffff" in failing, "the patch set's hash"
    passing = (reports / OTHER / "index.html").read_text()
    assert "Derived contract (sglang 0.5.15)" in passing
    assert "target.get_embed_and_head  &lt;- eagle_worker.py:88" in passing
    assert "<h2>Equivalence</h2>" in passing
    assert "<td>0.5</td><td>4</td><td>2</td>" in passing.replace("<td>0</td><td>0.05</td>", "")
    throughput = passing.split("<h2>Throughput</h2>", 1)[1]
    assert 'aria-label="decode"' in throughput
    assert "<title>absolute threshold 89.5</title>" in throughput
    assert throughput.count("data-series=") == 2, "baseline and EAGLE-3: two bars, no bar for .n or .cv"


def test_pages_are_self_contained(reports: Path) -> None:
    for page in htmlreport.write(reports):
        text = page.read_text()
        assert "<script" not in text
        assert "<link" not in text
        assert not re.search(r'(src|href)="(https?:)?//', text), f"{page} loads something from outside"


def test_runner_list_shows_cells_that_never_ran(reports: Path) -> None:
    conflict = cell_report(
        cell="cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.10",
        status="conflict",
        reason="sglang 0.5.10 requires sglang-kernel==0.4.1",
        properties={},
        suites=(),
    )
    stored = [verdict.read(reports / c / "verdict.json").report for c in (CELL, OTHER)]
    htmlreport.write(reports, [*stored, conflict])
    page = (reports / "index.html").read_text()
    assert 'data-verdict="conflict"' in page
    assert "requires sglang-kernel==0.4.1" in page
    assert "3 cells: 1 conflict, 1 failed, 1 passed" in page


def test_history_trends_appear_on_the_cell_page(reports: Path, tmp_path: Path) -> None:
    runs = tmp_path / "history"
    for night, value in (("n1", "92.6"), ("n2", "89.5")):
        suites: dict[str, list[CaseSpec]] = {
            **PASSING,
            "40-throughput": [
                ("test_figures", "passed", "", {"decode_tok_s.median": value, "decode_tok_s.n": "5"})
            ],
        }
        write_cell(runs / night, OTHER, suites)
    htmlreport.write_history(history.write(runs, reports), reports)
    htmlreport.write(reports)
    page = (reports / OTHER / "index.html").read_text()
    over_time = page.split("<h3>Over time (medians)</h3>", 1)[1]
    assert 'class="trend"' in over_time
    assert "<title>n2: 89.5</title>" in over_time
    assert 'href="history.html"' in (reports / "index.html").read_text()


# --------------------------------------------------------------------------- a real browser


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB/RGBA PNG, decoded with zlib and struct."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8
    assert colour in (2, 6), f"colour type {colour}"
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(
            bytes(line) if bpp == 3 else bytes(v for j in range(0, stride, 4) for v in line[j : j + 3])
        )
        prev = line
    return width, height, rows


def _count(rows: list[bytes], rgb: tuple[int, int, int]) -> int:
    needle = bytes(rgb)
    return sum(1 for row in rows for i in range(0, len(row), 3) if row[i : i + 3] == needle)


def _hex(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


#: A parametrized test id with no space to break at, longer than any grid column.
LONG_ID = "test_finding[" + "-".join(f"table_sm_120_torch_symm_mem_world_size_{n}" for n in range(6)) + "]"
#: What a page reports of its own layout once Chromium has laid it out (the test's copy only: the report has no
#: script). Overflow: a grid or table cell whose content is wider than the cell (it runs into the next one).
_MEASURE = """<script>
const overflow = [];
for (const el of document.querySelectorAll("td, th, .causes li")) {
  if (el.scrollWidth > el.clientWidth + 1) overflow.push(el.textContent.slice(0, 60));
}
const causes = [...document.querySelectorAll(".causes li")].map(
  (li) => [li.dataset.severity, Math.round(li.getBoundingClientRect().top), li.dataset.cells]);
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify({overflow, causes, width: document.documentElement.scrollWidth});
document.body.append(pre);
</script>"""


def _more_cells(reports: Path) -> None:
    """Two more cells that only need a GPU (so "needs GPU" is the most widespread reason) and one that fails with
    a long test id."""
    skip: dict[str, list[CaseSpec]] = {
        "20-eagle3": [("test_runtime[Kimi]", "skipped", "needs GPU: no NVIDIA GPU", {})]
    }
    for n in (1, 2):
        write_cell(reports, f"cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.{n}", {**PASSING, **skip})
    long: dict[str, list[CaseSpec]] = {"10-capability": [(LONG_ID, "failed", f"{LONG_ID}: KeyError: 12", {})]}
    write_cell(reports, "cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.3", {**PASSING, **long})


def test_report_renders_in_headless_chromium(reports: Path, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    _more_cells(reports)
    htmlreport.write(reports)
    url = (reports / "index.html").resolve().as_uri()
    flags = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
        # sRGB output, so the page's colours reach the PNG unchanged.
        "--force-color-profile=srgb", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
    ]  # fmt: skip
    dom = subprocess.run(
        [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=False
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    grid = _cells(dom.stdout)
    assert grid[(CELL, "1")] == "failed"
    assert grid[(OTHER, "4")] == "passed"
    assert 'class="o o-failed"' in dom.stdout
    shot = tmp_path / "index.png"
    done = subprocess.run(
        [*flags, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1400, 900)
    green = _count(rows, _hex(htmlreport.COLOURS["passed"]))
    red = _count(rows, _hex(htmlreport.COLOURS["failed"]))
    amber = _count(rows, _hex(htmlreport.COLOURS["skipped"]))
    # Six green grid cells of about 92x28 px, three red ones (two suites and the verdict), one amber.
    assert green > 6 * 1500, f"{green} pass-green pixels"
    assert red > 3 * 1500, f"{red} fail-red pixels"
    assert amber > 1000, f"{amber} skip-amber pixels"
    white = _count(rows, (255, 255, 255))
    assert white < width * height * 0.97, "the page rendered more than a blank screen"
    # The cell page behind the link renders too, with its charts.
    cell_url = (reports / OTHER / "index.html").resolve().as_uri()
    page = subprocess.run(
        [*flags, "--dump-dom", cell_url], capture_output=True, text=True, timeout=120, check=False
    )
    assert page.stdout.count("<svg") >= 2
    # Laid out by Chromium: no cell's text runs into the next one (the long id wraps inside its cell) and the
    # root causes read failures first, though "needs GPU" is the most widespread.
    from stackfarm import reports as summaries

    stored = [verdict.read(path).report for path in sorted(reports.glob("*/verdict.json"))]
    summaries.write_summaries(stored, reports)
    for name in ("index.html", "summary.html"):
        copy = reports / f"measured-{name}"
        text = (reports / name).read_text(encoding="utf-8")
        copy.write_text(text.replace("</body>", f"{_MEASURE}</body>"), encoding="utf-8")
        laid = subprocess.run(
            [*flags, "--dump-dom", copy.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        found = re.search(r'<pre id="measured">(.*?)</pre>', laid.stdout)
        assert found is not None, laid.stderr[-2000:]
        measured = json.loads(html.unescape(found[1]))
        assert measured["overflow"] == [], (
            f"{name}: cells whose text runs out of them: {measured['overflow']}"
        )
        assert measured["width"] <= 1400, f"{name} is wider than the window: {measured['width']} px"
        severities = [kind for kind, _, _ in measured["causes"]]
        assert severities == ["failed", "failed", "failed", "unanswered"], (name, measured["causes"])
        tops = [top for _, top, _ in measured["causes"]]
        assert tops == sorted(tops), "the list is drawn in that order"
    assert LONG_ID in (reports / "index.html").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the grid's reasons and colours

H200 = Path(__file__).parent / "test_throughput_fixtures" / "h200-history"
H200_CELL = "cu130-torch2.11.0-sk0.4.4-fi0.6.12-sgl0.5.15"


def _skips(passed: int, skipped: int) -> list[CaseSpec]:
    none: dict[str, str] = {}
    out: list[CaseSpec] = [(f"test_ok[{i}]", "passed", "", none) for i in range(passed)]
    return out + [(f"test_gpu[{i}]", "skipped", "needs GPU: no NVIDIA GPU", none) for i in range(skipped)]


def _judged_cell(root: Path, cell: str, suites: dict[str, list[CaseSpec]]) -> None:
    """write_cell, with each suite's outcome and the cell's verdict from verdict's own rule (as the runner
    stores them)."""
    report = write_cell(root, cell, suites)
    judged = [verdict.read_suite(root / cell / f"{s}.xml", cell=cell, suite=s) for s in suites]
    verdict.save(root, verdict.judged(dataclasses.replace(report, suites=tuple(judged))))


def test_incomplete_is_amber_with_its_reason_and_failures_group_by_root_cause(tmp_path: Path) -> None:
    from stackfarm import reports as summaries

    root = tmp_path / "reports"
    cells = ["cu128-torch2.9.1-sk0.3.21-fi0.6.3-sgl0.5.9", "cu130-torch2.9.1-sk0.4.1-fi0.6.7-sgl0.5.10"]
    for i, cell in enumerate(cells):
        _judged_cell(root, cell, {
            "10-capability": [(f"test_finding[table-sm_12{i}-torch_symm_mem]", "failed",
                               f"KeyError: 12 in torch_symm_mem.py:{40 + i} (sglang 0.5.{9 + i})", {})],
            "30-numerics": _skips(2, 23),
        })  # fmt: skip
    _judged_cell(root, OTHER, {"10-capability": [("test_ok", "passed", "", {})]})
    htmlreport.write(root)
    page = (root / "index.html").read_text()
    row = re.search(rf'<tr data-cell="{re.escape(cells[0])}".*?</tr>', page)
    assert row is not None
    numerics = re.search(
        r'<td class="o o-(\w+)" data-outcome="\w+"[^>]*>([^<]*)<span class="why">([^<]*)',
        row[0].split("</td>", 1)[1],
    )
    assert numerics is not None
    assert numerics.groups() == (
        "incomplete",
        "2/25 passed, 23 skipped",
        "test_gpu[0]: needs GPU: no NVIDIA GPU",
    )
    assert '<span class="why">test_finding[table-sm_120-torch_symm_mem]: KeyError: 12' in row[0], (
        "not hover-only"
    )
    assert 'data-outcome="passed" title="passed">1/1 passed</td>' in page, "a green cell carries no reason"
    causes = page.split("<h2>Failures by root cause</h2>", 1)[1]
    assert "2 cells: 10-capability: test_finding: KeyError: 12 in torch_symm_mem.py (sglang X.Y)" in causes
    assert "2 cells: 30-numerics: test_gpu: needs GPU: no NVIDIA GPU" in causes
    assert all(f'href="{c}/index.html"' in causes for c in cells)
    assert OTHER not in causes

    reports = [verdict.read(root / c / "verdict.json").report for c in [*cells, OTHER]]
    md = summaries.summary_markdown(reports)
    assert (
        "- ❌ failed: 2 cells: 10-capability: test_finding: KeyError: 12 in torch_symm_mem.py (sglang X.Y) — "
        in md
    )
    assert f"`{cells[0]}`, `{cells[1]}`" in md
    assert "🟡 2/25 passed, 23 skipped: test_gpu[0]: needs GPU" in md
    # One colour table for both HTML grids: amber is incomplete in each.
    html_summary = summaries.summary_html(reports)
    amber = f".o-incomplete,.v-incomplete{{background:{htmlreport.COLOURS['incomplete']};color:#fff}}"
    assert amber in html_summary
    assert amber in page
    assert summaries.COLOURS is htmlreport.COLOURS
    assert 'class="o o-incomplete"' in html_summary


# --------------------------------------------------------------------------- throughput, on real H200 runs


def _h200(tmp_path: Path, run: str) -> Path:
    root = tmp_path / run
    shutil.copytree(H200 / run, root)
    htmlreport.write(root)
    return root / H200_CELL / "index.html"


def test_throughput_one_chart_per_family_with_whiskers_and_thresholds(tmp_path: Path) -> None:
    page = _h200(tmp_path, "run-3").read_text()
    section = page.split("<h2>Throughput</h2>", 1)[1].split("<h2>", 1)[0]
    charts = re.findall(r'<svg [^>]*aria-label="([^"]+)" class="bars">(.*?)</svg>', section)
    assert [title for title, _ in charts] == ["decode", "batch", "TTFT / ITL", "accept length"]
    by_title = dict(charts)
    bars = {t: re.findall(r"<title>([^<]+): [0-9.e+-]+</title></rect>", svg) for t, svg in charts}
    assert bars["decode"] == ["decode · baseline", "decode · EAGLE-3"]
    assert bars["batch"] == ["batch 8 · baseline", "batch 8 · EAGLE-3"]
    assert bars["TTFT / ITL"] == [
        "TTFT · baseline", "TTFT · EAGLE-3", "ITL · baseline", "ITL · EAGLE-3",
        "batch 8 TTFT · baseline", "batch 8 TTFT · EAGLE-3",
    ]  # fmt: skip
    assert bars["accept length"] == ["accept length · EAGLE-3"]
    assert not any(k in section for k in ('aria-label="decode_tok_s.n"', 'aria-label="decode_tok_s.cv"'))
    # Every bar has its interval; each threshold is drawn on its own bar (decode: absolute and regression).
    assert all(svg.count('class="ci"') == svg.count("data-series=") for svg in by_title.values())
    decode = by_title["decode"]
    assert "<title>absolute threshold 450</title>" in decode
    assert re.search(r"<title>regression threshold 543\.8</title>", decode)
    assert "<title>absolute threshold 60</title>" in decode, "EAGLE-3's own threshold"
    assert "<title>absolute threshold 20</title>" in by_title["TTFT / ITL"]
    # The scale is the chart's own: the largest bar (or interval or threshold) spans most of the plot.
    widths = [int(w) for w in re.findall(r'<rect x="230" y="\d+" width="(\d+)" height="16"', decode)]
    assert max(widths) > 300
    # The rest are tables: every figure (eagle3_over_baseline too), every check.
    assert "<code>eagle3_over_baseline</code>" in section
    assert section.count("<h3>Threshold checks</h3>") == 1
    assert "thresholds.1x-h200.max_regression_pct" in section


def test_throughput_bars_in_chromium_keep_the_ratio_of_the_medians(tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    page = _h200(tmp_path, "run-5")
    assert 'data-value="218.741"' in page.read_text()
    assert 'data-value="29.8971"' in page.read_text()
    shot = tmp_path / "cell.png"
    flags = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
        "--force-color-profile=srgb", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,4000",
    ]  # fmt: skip
    done = subprocess.run(
        [*flags, f"--screenshot={shot}", page.resolve().as_uri()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    _, _, rows = _png_pixels(shot.read_bytes())
    from stackfarm.sections.html import SERIES_COLOURS

    def runs(colour: str) -> list[int]:
        """The longest horizontal run of `colour` in each screenshot row."""
        needle, out = bytes(_hex(colour)), []
        for row in rows:
            best = cur = 0
            for i in range(0, len(row), 3):
                cur = cur + 1 if row[i : i + 3] == needle else 0
                best = max(best, cur)
            out.append(best)
        return out

    def first_bar(lengths: list[int], after: int = 0, at_least: int = 20) -> tuple[int, int]:
        """(last row, length) of the first band of 10+ rows below `after` each holding a run >= `at_least`
        px: a bar is 16 px tall (a link's underline, also blue, is one row)."""
        y = after
        while True:
            start = next(y for y in range(y, len(lengths)) if lengths[y] >= at_least)
            end = next(y for y in range(start, len(lengths)) if lengths[y] < at_least)
            if end - start >= 10:
                return end, max(lengths[start:end])
            y = end

    # The decode chart is the section's first: its baseline bar, then EAGLE-3's right below it.
    end, baseline = first_bar(runs(SERIES_COLOURS["baseline"]))
    _, eagle3 = first_bar(runs(SERIES_COLOURS["EAGLE-3"]), after=end, at_least=12)
    ratio = eagle3 / baseline
    expected = 29.89714858979729 / 218.74054070957132
    print(
        f"decode bars: baseline {baseline} px, EAGLE-3 {eagle3} px, ratio {ratio:.4f} (medians {expected:.4f})"
    )
    assert abs(ratio / expected - 1) <= 0.05, (baseline, eagle3)
    assert baseline > 300, "the baseline bar spans most of the plot"


# --------------------------------------------------------------------------- trend lines: their scale


def _trend(page: str, key: str) -> tuple[str, list[float]]:
    """(the chart's svg, the y of each point) of the trend chart of `key`."""
    svg = re.search(rf'<svg [^>]*aria-label="{re.escape(key)}" class="trend"[^>]*>.*?</svg>', page)
    assert svg is not None, key
    points = re.search(r'<polyline points="([^"]+)"', svg[0])
    assert points is not None
    return svg[0], [float(p.split(",")[1]) for p in points[1].split()]


def test_a_small_change_is_drawn_small_and_said_and_one_figures_statistics_share_a_scale(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "history"
    nights = {"n1": ("92.6", "91.9", "93.1", "300"), "n2": ("92.14", "91.5", "92.9", "90")}
    for night, (median, low, high, batch) in nights.items():
        figures = {"decode_tok_s.median": median, "decode_tok_s.ci_low": low, "decode_tok_s.ci_high": high,
                   "batch8_tok_s.median": batch}  # fmt: skip
        write_cell(runs / night, OTHER, {"40-throughput": [("test_figures", "passed", "", figures)]})
    page = htmlreport.history_page(history.build(history.load_history(runs)))
    key = "40-throughput::test_figures::decode_tok_s"
    svg, ys = _trend(page, f"{key}.median")
    plot_h = 164 - 38 - 28
    # 0.5 % lower: a tenth of the plot at most (each scale spans >= 10 % of its values), never top to bottom.
    assert 0 < max(ys) - min(ys) <= 0.1 * plot_h, ys
    assert "first → last -0.50 %" in html.unescape(svg)
    assert "min 92.14, max 92.6" in svg
    # The median and the interval ends of one figure share a scale, marked on each chart.
    scales = {re.search(r'data-low="([^"]+)" data-high="([^"]+)"', _trend(page, f"{key}.{s}")[0]).groups()  # type: ignore[union-attr]
              for s in ("median", "ci_low", "ci_high")}  # fmt: skip
    assert len(scales) == 1, scales
    # A real drop (300 -> 90 tok/s) still spans the plot.
    _, drop = _trend(page, "40-throughput::test_figures::batch8_tok_s.median")
    assert max(drop) - min(drop) == pytest.approx(plot_h, abs=0.2)
