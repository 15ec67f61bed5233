"""What a build tells its caller: what it read, skipped, cut and embedded, and why it rebuilt or ran slower."""

from __future__ import annotations

from dataclasses import dataclass, field

from gradfuse.sources.base import SourceError


@dataclass
class BuildReport:
    name: str
    status: str  # "built", "unchanged", or "failed" (`error` says why; `gradfuse build` goes on with the next)
    documents: int
    seconds: float
    embedded_now: int = 0  # vectors computed in this build; the rest came from the cache
    ingest: dict[str, int] = field(default_factory=dict)
    formats: dict[str, int] = field(default_factory=dict)  # files read, by format (files sources)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (file, reason, detail) of unreadable ones
    cut: list[str] = field(default_factory=list)  # what was read only in part, to a limit ("file: what (option)")
    files: dict[str, int] = field(default_factory=dict)  # a folder's sync: files listed, read again, dropped
    written: int | None = None  # rows inserted or updated (sources in a database)
    deleted: int | None = None  # rows removed because their document left the input
    encoder: str = ""  # what embedded the passages: the encoder's name and backend
    notes: list[str] = field(default_factory=list)  # why it was rebuilt whole, or ran slower than it could
    error: str = ""  # why a build failed (its source's published version stays as it was)

    @property
    def skipped_by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, reason, _ in self.skipped:
            counts[reason] = counts.get(reason, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else float("inf")


class BuildsFailed(SourceError):
    """Some declared sources failed to build (`gradfuse build`): every source was tried, and `reports` holds each
    one's report, the failed ones with status "failed" and their error."""

    def __init__(self, reports: list[BuildReport]):
        self.reports = reports
        failed = [r for r in reports if r.status == "failed"]
        super().__init__(f"{len(failed)} of {len(reports)} source(s) failed to build (their published versions are "
                         "unchanged): " + "; ".join(f"{r.name}: {r.error}" for r in failed))
