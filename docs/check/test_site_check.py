"""The site checker on small hand-written sites, in a real headless Chromium (skipped without one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKER = Path(__file__).with_name("site_check.py")
CHROMIUM = any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))
needs_chromium = pytest.mark.skipif(not CHROMIUM, reason="no Chromium on PATH (apt-get install -y chromium)")

STYLE = "<style>body{margin:0;width:1000px} .col{width:600px} pre{margin:0}</style>"
LONG = "x = " + "1 + " * 200 + "1"


def page(body: str) -> str:
    return f"<!doctype html><html><head><title>t</title>{STYLE}</head><body><div class='col'>{body}</div></body></html>"


def write_site(root: Path, pages: dict[str, str]) -> Path:
    for name, html in pages.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(html, encoding="utf-8")
    return root


def check(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECKER), str(site)], capture_output=True, text=True, timeout=120)


@needs_chromium
def test_a_clean_site_passes_with_its_counts(tmp_path: Path) -> None:
    site = write_site(
        tmp_path,
        {
            "index.html": page(
                f"<h2 id='top'>x</h2><pre style='overflow-x:auto'>{LONG}</pre>"
                "<table style='display:block;overflow-x:auto'><tr><td>" + "wide_" * 300 + "</td></tr></table>"
                "<a href='guide/#usage'>guide</a> <a href='#top'>top</a> <a href='https://example.org/'>out</a>"
            ),
            "guide/index.html": page("<h2 id='usage'>usage</h2><a href='../'>home</a>"),
        },
    )
    done = check(site)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        "site check: 2 pages at 1280 px, 1 code blocks, 1 tables, 3 internal links (2 with anchors): ok in "
    )


@needs_chromium
def test_each_kind_of_problem_is_one_line_naming_page_and_cause(tmp_path: Path) -> None:
    site = write_site(
        tmp_path,
        {
            "index.html": page(
                f"<pre style='overflow-x:hidden'>{LONG}</pre>"  # clipped: wider than its box, no scrolling
                "<table><tr><td>" + "wide_" * 300 + "</td></tr></table>"  # pushes past the column and page
                "<a href='missing/'>gone</a> <a href='guide/#nowhere'>bad anchor</a>"
            ),
            "guide/index.html": page("<script src='https://cdn.invalid/lib.js'></script><p>g</p>"),
        },
    )
    done = check(site)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert any(
        line.startswith('site check: /: pre "x = 1 + 1 + ') and "in a 600 px box that does not scroll" in line
        for line in lines
    )
    assert any(
        line.startswith("site check: /: table") and "overflows its container div.col (600 px)" in line for line in lines
    )
    assert any(line.startswith("site check: /: the page scrolls sideways: ") for line in lines)
    assert "site check: /: link 'gone' -> /missing/: no such page in the site" in lines
    assert "site check: /: link 'bad anchor' -> /guide/#nowhere: that page has no such anchor" in lines
    assert any("guide/index.html: loads https://cdn.invalid/lib.js from another site" in line for line in lines)
    assert lines[-1].startswith("site check: 2 pages at 1280 px") and "problem(s) in " in lines[-1]
    assert "Traceback" not in done.stdout + done.stderr


def test_a_folder_without_a_site_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = check(tmp_path)
    assert done.returncode == 2
    assert (
        done.stdout.strip()
        == f"site check: {tmp_path} has no index.html; build the site first (mkdocs build --site-dir {tmp_path})"
    )
    assert done.stderr == ""


def test_no_chromium_and_no_way_to_install_it_is_one_line_and_exit_2(tmp_path: Path) -> None:
    site = write_site(tmp_path / "site", {"index.html": page("<p>x</p>")})
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, str(CHECKER), str(site)], capture_output=True, text=True, timeout=60, env={"PATH": str(empty)}
    )
    assert done.returncode == 2
    assert done.stdout.strip() == (
        "site check: no Chromium on PATH (looked for chromium, chromium-browser, google-chrome, google-chrome-stable);"
        " install it, e.g. `sudo apt-get install -y chromium`"
    )
    assert done.stderr == ""
