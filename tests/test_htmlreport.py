"""htmlreport: the grid and the cell pages, from verdict.json + JUnit properties; and in a real browser.

The reports are small synthetic reports/ folders (see test_history.write_cell) carrying the properties the
suites record: 10-capability's findings and grid, the runner's patch statuses, 20-eagle3's contract,
equivalence figures (issue 7's names) and throughput figures with a threshold.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

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
    "30-equivalence": [
        ("test_e2e[eagle3-bf16]", "passed", "", {"match_rate": "0.5", "first_divergence": "4", "near_ties": "2",
                                                 "max_abs_err": "0", "tolerance": "0.05"}),
    ],
    "40-throughput": [
        ("test_decode[baseline]", "passed", "", {"decode_tok_s": "92.6", "threshold": "89.5", "ci_low": "91.9", "ci_high": "93.1"}),
        ("test_decode[eagle3]", "passed", "", {"decode_tok_s": "54.1", "threshold": "92.6"}),
    ],
}  # fmt: skip


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    root = tmp_path / "reports"
    write_cell(
        root,
        CELL,
        FAILING,
        properties={"axis.sglang": "0.5.9", "sglang.version": "0.5.9", "sglang.sha256": "8a" * 32,
                    "patches.sm120-capability.sha256": "ff" * 32},
        suite_properties={"10-capability": {"capability.sm_120.sglang": "missing-key x1", "capability.sm_90.sglang": "ok"}},
    )  # fmt: skip
    write_cell(root, OTHER, PASSING, properties={"axis.sglang": "0.5.15", "sglang.version": "0.5.15"})
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
        "30-equivalence",
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
    assert "missing-key x1" in failing, "the arch x component grid from the testsuite properties"
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
    assert 'aria-label="decode_tok_s"' in throughput
    assert "<title>threshold 89.5</title>" in throughput
    assert throughput.count("<rect") >= 2


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
            "40-throughput": [("test_decode[baseline]", "passed", "", {"decode_tok_s": value})],
        }
        write_cell(runs / night, OTHER, suites)
    htmlreport.write_history(history.write(runs, reports), reports)
    htmlreport.write(reports)
    page = (reports / OTHER / "index.html").read_text()
    over_time = page.split("<h3>Over time</h3>", 1)[1]
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


def test_report_renders_in_headless_chromium(reports: Path, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
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
