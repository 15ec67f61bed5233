"""Markdown and HTML, cut along their headings: each section a unit under its heading path. HTML's boilerplate
(navigation, footers, sidebars) is removed by trafilatura, which gives the main content as Markdown."""

from __future__ import annotations

import bisect
import re

from gradfuse.candidate import Location
from gradfuse.ingest.readers import Parsed, Reading

# Linear: the title's trailing spaces and closing hashes are stripped afterwards ("(.+?)[ \t#]*$" backtracked
# quadratically: a 144 KB heading line of spaces took 53 s).
_HEADING = re.compile(r"^(#{1,6})[ \t]+([^\n]*)$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)  # a "# comment" in code is no heading


def read_markdown(text: str, name: str, reading: Reading) -> Parsed:
    """Sections from one heading to the next; the text before the first heading is a section of its own. The
    file's title is its first heading."""
    fences = [(m.start(), m.end()) for m in _FENCE.finditer(text)]  # in order, apart
    starts = [start for start, _ in fences]

    def in_fence(position: int) -> bool:  # by bisection: a scan of every fence per heading was quadratic
        index = bisect.bisect_right(starts, position) - 1
        return index >= 0 and position < fences[index][1]

    headings = [(m.start(), len(m.group(1)), title) for m in _HEADING.finditer(text)
                if (title := m.group(2).rstrip(" \t#").strip()) and not in_fence(m.start())]
    units, path = [], []
    bounds = [start for start, _, _ in headings] + [len(text)]
    if bounds[0] > 0 and text[: bounds[0]].strip():
        units.append(reading.unit(text[: bounds[0]], Location(name), 0))
    for (start, level, title), end in zip(headings, bounds[1:]):
        path = [(outer, heading) for outer, heading in path if outer < level] + [(level, title)]
        units.append(reading.unit(text[start:end], Location(name, headings=tuple(t for _, t in path)), start))
    title = headings[0][2] if headings else ""
    return Parsed(units or [reading.unit(text, Location(name), 0)], text, title=title)


def read_html(content: str, name: str, reading: Reading) -> Parsed:
    """The sections of a page's main content, titled by its <title>; a page trafilatura finds none in is read
    whole as text."""
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
    sections = read_markdown(main, name, reading)
    return Parsed(sections.units, sections.text, title=title)
