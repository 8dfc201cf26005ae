"""Check the built docs site as a reader sees it: every page in headless Chromium at 1280 px.

    python docs/check/site_check.py SITE_DIR [--width 1280]

The site is served on 127.0.0.1 at a port the OS picks, and each HTML page is loaded in Chromium
(found on PATH, or installed from Debian's packages when absent and running as root). A page fails
when:

- a code block or table is wider than its container and is not scrollable there (its right edge
  clipped or pushing the page sideways), or the page itself scrolls sideways;
- an internal link points to a page that does not exist, or to an anchor that page lacks;
- it loads anything from another origin (a CDN script, stylesheet or font): the docs work offline.

Exit status 0 when every page passes, 1 with one line per problem, 2 when the check cannot run.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from browser import Browser, BrowserError, find_chromium

# Runs in each loaded page. Layout is read after the load event, with the theme's scripts run.
PAGE_SCRIPT = r"""
(() => {
  const scrolls = (e) => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
      (e.className && typeof e.className === 'string' ? '.' + e.className.trim().split(/\s+/).join('.') : '');
  const snippet = (e) => (e.innerText || '').trim().split('\n')[0].slice(0, 60);
  const problems = [];
  const blocks = [...document.querySelectorAll('pre, table')].filter((e) => e.getClientRects().length);
  for (const e of blocks) {
    if (e.scrollWidth > e.clientWidth + 1 && !scrolls(e)) {
      problems.push(`${name(e)} "${snippet(e)}": content ${e.scrollWidth} px wide in a ${e.clientWidth} px box that does not scroll`);
      continue;
    }
    // Up to the first scrolling ancestor, every ancestor must contain the block.
    const box = e.getBoundingClientRect();
    for (let p = e.parentElement; p && p !== document.documentElement; p = p.parentElement) {
      if (scrolls(p)) break;
      const r = p.getBoundingClientRect();
      if (box.right > r.right + 1 || box.left < r.left - 1) {
        problems.push(`${name(e)} "${snippet(e)}": ${Math.round(box.width)} px wide, overflows its container ${name(p)} (${Math.round(r.width)} px)`);
        break;
      }
    }
  }
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) {
    problems.push(`the page scrolls sideways: ${root.scrollWidth} px wide in a ${root.clientWidth} px window`);
  }
  const ids = [...document.querySelectorAll('[id]')].map((e) => e.id)
      .concat([...document.querySelectorAll('a[name]')].map((e) => e.name));
  const links = [...document.querySelectorAll('a[href]')]
      .filter((a) => a.origin === location.origin && !a.getAttribute('href').startsWith('javascript:'))
      .map((a) => ({href: a.href, text: (a.innerText || a.title || '').trim().slice(0, 40)}));
  const pre = document.querySelectorAll('pre').length, tables = document.querySelectorAll('table').length;
  return {problems, ids, links, pre, tables};
})()
"""

# <script src=...> and <link href=...> to another host, as written in the HTML.
REMOTE_ASSET = re.compile(r"""<(?:script|link)\b[^>]*?\b(?:src|href)\s*=\s*["']?((?:https?:)?//[^"'\s>]+)""", re.I)


@dataclass
class Report:
    pages: int = 0
    links: int = 0
    anchored: int = 0
    blocks: int = 0
    tables: int = 0
    problems: list[str] = field(default_factory=list)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line per request would bury the result
        pass


@contextmanager
def serve(site: Path) -> Iterator[str]:
    """The site over HTTP on 127.0.0.1, at a port the OS picks; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def page_paths(site: Path) -> list[str]:
    """URL path of every HTML page, ``dir/index.html`` as ``/dir/``, as mkdocs links them."""
    paths = []
    for file in sorted(site.rglob("*.html")):
        relative = file.relative_to(site).as_posix()
        paths.append("/" + (relative[: -len("index.html")] if relative.endswith("index.html") else relative))
    return paths


def target_file(site: Path, path: str) -> Path | None:
    """The file a URL path serves (``/a/`` -> ``a/index.html``), or None when there is none."""
    candidate = site / unquote(path).lstrip("/")
    if candidate.is_dir():
        candidate = candidate / "index.html"
    return candidate if candidate.is_file() else None


def remote_assets(site: Path) -> list[str]:
    problems = []
    for file in sorted(site.rglob("*.html")):
        for url in REMOTE_ASSET.findall(file.read_text(encoding="utf-8", errors="replace")):
            problems.append(
                f"{file.relative_to(site).as_posix()}: loads {url} from another site (the docs must work offline)"
            )
    return problems


def check_site(site: Path, *, chromium: str, width: int = 1280) -> Report:
    report = Report(problems=remote_assets(site))
    ids: dict[Path, set[str]] = {}
    links: list[tuple[str, str, str]] = []  # (page, href, text)
    with serve(site) as base, Browser.start(chromium, width=width) as browser:
        for path in page_paths(site):
            browser.requests.clear()
            browser.open(base + path)
            found = browser.evaluate(PAGE_SCRIPT)
            report.pages += 1
            report.blocks += found["pre"]
            report.tables += found["tables"]
            report.problems += [f"{path}: {problem}" for problem in found["problems"]]
            report.problems += [
                f"{path}: loads {url} from another site (the docs must work offline)"
                for url in browser.requests
                if urlsplit(url).scheme in ("http", "https", "ws", "wss") and not url.startswith(base)
            ]
            served = target_file(site, path)
            assert served is not None  # listed from the site folder itself
            ids[served] = set(found["ids"])
            links += [(path, link["href"], link["text"]) for link in found["links"]]
    for page, href, text in links:
        report.links += 1
        url = urlsplit(href)
        target = target_file(site, url.path)
        if target is None:
            report.problems += [f"{page}: link {text!r} -> {url.path}: no such page in the site"]
            continue
        if not url.fragment:
            continue
        report.anchored += 1
        anchor = unquote(url.fragment)
        if target not in ids:
            report.problems += [f"{page}: link {text!r} -> {url.path}#{anchor}: anchor into a file that is not a page"]
        elif anchor not in ids[target]:
            report.problems += [f"{page}: link {text!r} -> {url.path}#{anchor}: that page has no such anchor"]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site folder (mkdocs build --site-dir ...)")
    parser.add_argument("--width", type=int, default=1280, help="window width in CSS px (default: %(default)s)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"site check: {args.site} has no index.html; build the site first (mkdocs build --site-dir {args.site})")
        return 2
    start = time.perf_counter()
    try:
        report = check_site(args.site.resolve(), chromium=find_chromium(), width=args.width)
    except BrowserError as error:
        print(f"site check: {error}")
        return 2
    for problem in report.problems:
        print(f"site check: {problem}")
    verdict = f"{len(report.problems)} problem(s)" if report.problems else "ok"
    print(
        f"site check: {report.pages} pages at {args.width} px, {report.blocks} code blocks, {report.tables} tables, "
        f"{report.links} internal links ({report.anchored} with anchors): {verdict} in {time.perf_counter() - start:.1f} s"
    )
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
