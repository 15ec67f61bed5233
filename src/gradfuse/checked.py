"""The value types of settings read from gradfuse.toml, checked by pydantic when the file is read (config.py):
a count is a whole number of at least 1, a number is finite, a string is a string. `k = -3`, `weight = nan`,
`timeout_s = "fast"` or `cors_origins = "x"` are errors that name the key, not surprises later."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field

MAX_DEPTH = 100_000  # candidates asked of one source: tantivy panics far above (10**12 aborted the process)

LOOPBACK = ("localhost", "127.0.0.1", "::1")  # hosts a key may be sent to over plain http
FILE_SETTINGS = ConfigDict(extra="forbid", allow_inf_nan=False)  # a dataclass's __pydantic_config__
Count = Annotated[int, Field(ge=1, strict=True)]
Depth = Annotated[int, Field(ge=1, le=MAX_DEPTH, strict=True)]
Port = Annotated[int, Field(ge=0, le=65535, strict=True)]
NonNegative = Annotated[int, Field(ge=0, strict=True)]
Number = Annotated[float, Field(strict=True)]
Weight = Annotated[float, Field(ge=0, strict=True)]
Share = Annotated[float, Field(ge=0, le=1, strict=True)]  # a part of a whole
Seconds = Annotated[float, Field(gt=0, strict=True)]
Text = Annotated[str, Field(strict=True)]
Flag = Annotated[bool, Field(strict=True)]


class InvalidSourceName(ValueError):
    public = ("invalid source name: use 1 to 64 ASCII letters, digits, '-' or '_', starting with a letter or "
              "digit")


_SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", re.ASCII)


def check_source_name(name: str) -> str:
    """The one check of a source name, wherever one comes in (index, config, CLI, requests): a name becomes a
    folder, a prompt attribute and a log field, so it is 1-64 ASCII letters, digits, '-' or '_', starting with
    a letter or digit."""
    if not isinstance(name, str) or not _SOURCE_NAME.fullmatch(name):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:80] + "…")
        raise InvalidSourceName(f"invalid source name {shown}: use 1 to 64 ASCII letters, digits, '-' or '_', "
                                "starting with a letter or digit")
    return name
