"""Markdown and HTML, cut along their headings: each section a unit under its heading path. HTML's boilerplate
(navigation, footers, sidebars) is removed by trafilatura, which gives the main content as Markdown."""

from __future__ import annotations

import re

from gradfuse.candidate import Location
from gradfuse.sources.readers import Parsed, Unit

_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)  # a "# comment" in code is no heading


def read_markdown(text: str, name: str) -> Parsed:
    """Sections from one heading to the next; the text before the first heading is a section of its own."""
    fenced = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    headings = [m for m in _HEADING.finditer(text)
                if not any(start <= m.start() < end for start, end in fenced)]
    units, path = [], []
    bounds = [m.start() for m in headings] + [len(text)]
    if bounds[0] > 0 and text[: bounds[0]].strip():
        units.append(Unit(text[: bounds[0]], Location(name), 0))
    for match, end in zip(headings, bounds[1:]):
        level = len(match.group(1))
        path = [(outer, title) for outer, title in path if outer < level] + [(level, match.group(2).strip())]
        units.append(Unit(text[match.start():end], Location(name, headings=tuple(t for _, t in path)),
                          match.start()))
    return Parsed(units or [Unit(text, Location(name), 0)], text)


def read_html(content: str, name: str) -> tuple[str, Parsed]:
    """(title, sections) of a page's main content; a page trafilatura finds none in is read whole as text."""
    import trafilatura
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(content, "html.parser")
    title = soup.title.get_text(strip=True) if soup.title else ""
    main = trafilatura.extract(content, output_format="markdown", include_tables=True, include_links=False,
                               include_comments=False, favor_recall=True)
    if not main:
        for hidden in soup(["script", "style", "noscript"]):
            hidden.decompose()
        main = soup.get_text("\n", strip=True)
    return title, read_markdown(main, name)
