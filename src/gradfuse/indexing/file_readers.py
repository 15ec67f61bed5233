"""Who may read a folder's files: `[sources.NAME.readers]` rules matched against each file's path."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from gradfuse.access import InvalidReader, reader_rules
from gradfuse.ingest.documents import IngestError, IngestReport


@dataclass(frozen=True)
class FileReaders:
    """The readers of each file of a folder, by `[sources.NAME.readers]`: those of the last rule whose pattern
    matches the file's path in the folder ("hr/*" = ["hr"]; `*` matches across folders, as in a .gitignore the
    last match wins); a file no rule matches is for every reader of the source. A file read through a link has the
    readers of the path it leads to (a link in public/ to hr/pay.md is hr's)."""

    of: dict[str, tuple[str, ...]]  # each file's readers; empty: every reader of the source
    refused: dict[str, str]  # hard links across readers: neither path is indexed (each with the other path)
    unmatched: list[str]  # patterns no file matches: a misspelt folder would leave its files open

    def given(self, document):
        """`document` with the readers of its file."""
        names = self.of[document.parent_id or ""]
        return dataclasses.replace(document, readers=names) if names else document

    def refusal(self, file: str) -> tuple[str, str, str]:
        """How a refused file is reported (IngestReport.skipped_unreadable)."""
        return (file, "hard link", f"the same file as {self.refused[file]}, whose readers differ: neither is "
                "indexed (a symbolic link or a copy keeps each path's readers)")


def readers_by_file(rules: object, folder: Path, files: list[str]) -> FileReaders:
    try:
        checked = reader_rules(rules)
    except InvalidReader as error:
        raise IngestError(str(error)) from None
    unmatched, root = dict.fromkeys(rules), folder.resolve()
    readers_of: dict[str, tuple[str, ...]] = {}
    for file in files:
        path = _rule_path(root, file) if checked else file
        matched = [(pattern, names) for pattern, names in checked if fnmatch.fnmatchcase(path, pattern)]
        for pattern, _ in matched:
            unmatched.pop(pattern, None)
        readers_of[file] = matched[-1][1] if matched else ()
    return FileReaders(readers_of, _hard_links_across_readers(root, readers_of) if checked else {}, list(unmatched))


def with_file_readers(documents, rules: object, report: IngestReport, folder: Path):
    """Files' passages with their readers (`readers_by_file`); refused and unmatched ones are reported."""
    documents = list(documents)
    readers = readers_by_file(rules, folder, list(dict.fromkeys(d.parent_id or "" for d in documents)))
    report.skipped_unreadable.extend(readers.refusal(file) for file in readers.refused)
    for document in documents:
        if (document.parent_id or "") not in readers.refused:
            yield readers.given(document)
    report.unmatched_readers.extend(readers.unmatched)


def _hard_links_across_readers(root: Path, readers_of: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Files hard-linked to another path of the folder whose readers differ, each with one such path: a hard link
    of hr/pay.md placed in public/ would otherwise take public/'s readers (a symbolic link is followed, and takes
    its target's: `_rule_path`)."""
    by_inode: dict[tuple[int, int], list[str]] = {}
    for file in readers_of:
        try:
            found = os.stat(root / file)
        except OSError:
            continue
        if found.st_nlink > 1:
            by_inode.setdefault((found.st_dev, found.st_ino), []).append(file)
    refused = {}
    for paths in by_inode.values():
        if len({readers_of[path] for path in paths}) > 1:
            refused.update({path: next(p for p in paths if readers_of[p] != readers_of[path]) for path in paths})
    return refused


def _rule_path(root: Path, relative: str) -> str:
    """The path in the folder a file's readers are decided by: where a link leads, when that is in the folder."""
    target = (root / relative).resolve()
    return target.relative_to(root).as_posix() if target.is_relative_to(root) else relative
