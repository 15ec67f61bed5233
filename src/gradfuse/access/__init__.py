"""Who may read what: a principal (a key's holder) may read some sources, and within them the documents whose
readers name it or one of its groups; a document that names no readers is for everyone who may read its source.

Sources get the caller's `readers` (its name and groups, or None for every document) and filter inside their own
store before ranking: nothing a caller may not read leaves the engine (docs/access.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

Readers = frozenset[str] | None  # a caller's name and groups; None: it may read every document

_READER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}", re.ASCII)


class InvalidReader(ValueError):
    """A reader name that could not be pushed into an engine's filter safely."""


def check_reader(name: object) -> str:
    """A principal's, a group's or a document reader's name: 1 to 128 ASCII letters, digits, '_', '.', '@' or
    '-', starting with a letter or digit. It is written into engines' filters (a SQL `where`, a Milvus expression):
    no quote or space can reach them."""
    if not isinstance(name, str) or not _READER.fullmatch(name):
        shown = repr(name)[:80]
        raise InvalidReader(f"invalid reader name {shown}: use 1 to 128 ASCII letters, digits, '_', '.', '@' or '-', "
                            "starting with a letter or digit")
    return name


def document_readers(value: object, where: str) -> tuple[str, ...]:
    """A document's readers as an input gives them (a list of names, or one name), checked and sorted; empty: no
    restriction beyond the source's own."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise InvalidReader(f"{where}: readers must be a list of names, not {type(value).__name__}")
    try:
        return tuple(sorted({check_reader(n) for n in names}))
    except InvalidReader as error:
        raise InvalidReader(f"{where}: {error}") from None


def reader_rules(rules: object) -> list[tuple[str, tuple[str, ...]]]:
    """A files source's `[sources.NAME.readers]`, checked: (pattern, readers) in the order given."""
    if not isinstance(rules, dict):
        raise InvalidReader("readers must be a table of file patterns, each with a list of names: \"hr/*\" = [\"hr\"]")
    for pattern in rules:
        if pattern.startswith(("/", "./")):
            raise InvalidReader(f"readers pattern {pattern!r}: patterns match paths inside the folder, which start "
                                f"with no {pattern[:pattern.index('/') + 1]!r} (write {pattern.lstrip('./')!r})")
    return [(pattern, document_readers(names, f"readers {pattern!r}")) for pattern, names in rules.items()]


def may_read(document: Iterable[str] | None, readers: Readers) -> bool:
    """Whether a caller with `readers` may read a document whose readers are `document`."""
    if readers is None or not document:
        return True
    return not readers.isdisjoint(document)


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: its name and groups, the sources it may read (None: every source), and whether it
    reads every document whoever it is meant for (the single `api_key`, a local user, evaluation)."""

    name: str
    groups: frozenset[str] = frozenset()
    sources: frozenset[str] | None = None
    every_document: bool = False

    @property
    def readers(self) -> Readers:
        return None if self.every_document else frozenset({self.name, *self.groups})

    def may_read_source(self, source: str) -> bool:
        return self.sources is None or source in self.sources

    @property
    def reads_everything(self) -> bool:
        return self.every_document and self.sources is None

    def fingerprint(self) -> tuple:
        """The result cache's key of the caller: each principal's own (two who may read the same still share
        none, or a hit would tell one what the other asked), with what a result depends on of it."""
        return (self.name, None if self.sources is None else tuple(sorted(self.sources)),
                None if self.readers is None else tuple(sorted(self.readers)))


# No key, the single key, the library, eval and tune; "*" is no principal's name, so it shares no cache entry
EVERYTHING = Principal("*", every_document=True)
