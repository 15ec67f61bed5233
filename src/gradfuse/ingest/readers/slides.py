"""PowerPoint (.pptx, python-pptx): one unit per slide, its title, the text of its shapes (tables as rows), and
its speaker notes."""

from __future__ import annotations

import io

from gradfuse.candidate import Location
from gradfuse.ingest.readers import Parsed, Reading, Unreadable
from gradfuse.ingest.readers.tables import row_text


def read_pptx(data: bytes, name: str, reading: Reading) -> Parsed:
    from pptx import Presentation
    from pptx.exc import PackageNotFoundError

    try:
        deck = Presentation(io.BytesIO(data))
    except (PackageNotFoundError, KeyError, ValueError) as error:
        raise Unreadable("corrupt", f"not a readable PowerPoint file ({error})") from None
    slides = list(deck.slides)
    if len(slides) > reading.limits.max_pages:
        raise Unreadable("too many pages", f"{len(slides)} slides, over the limit of {reading.limits.max_pages} "
                                           "(--max-pages)")
    units = []
    for number, slide in enumerate(slides, start=1):
        title_shape = slide.shapes.title
        title = title_shape.text_frame.text.strip() if title_shape is not None and title_shape.has_text_frame else ""
        lines = [title] if title else []
        for shape in slide.shapes:
            if title_shape is not None and shape.shape_id == title_shape.shape_id:
                continue
            if shape.has_text_frame and shape.text_frame.text.strip():
                lines.append(shape.text_frame.text.strip())
            elif getattr(shape, "has_table", False) and shape.has_table:
                lines += [row_text((cell.text for cell in row.cells), reading, escaped=False)
                          for row in shape.table.rows]
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = slide.notes_slide.notes_text_frame.text.strip()
            if notes:
                lines.append(f"Notes: {notes}")
        text = "\n".join(lines)
        if not text:
            continue
        units.append(reading.unit(text, Location(name, slide=number, headings=(title,) if title else ())))
    return Parsed.joined(units)
