"""One collection as several sources by a stable split of its document ids (`part = "1/2"` on a beir or jsonl
source): how a benchmark puts one corpus into several engines, as a team's documents end up spread over stores that
look alike, so that each query's relevant documents sit in one or two of them."""

from __future__ import annotations

import hashlib


def parse_part(value: object) -> tuple[int, int]:
    """`"i/n"` → (i, n), 1 ≤ i ≤ n; anything else is refused with the form it takes."""
    try:
        index, count = (int(x) for x in str(value).split("/"))
    except ValueError:
        raise ValueError(f"part is 'i/n' (this source holds the i-th of n parts of its collection), not {value!r}"
                         ) from None
    if not 1 <= index <= count:
        raise ValueError(f"part {value!r}: i must be between 1 and n")
    return index, count


def part_of(doc_id: str, count: int) -> int:
    """The part (1..count) that holds `doc_id`: a hash of the id, so that every build and every judge agree."""
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") % count + 1
