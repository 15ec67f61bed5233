"""The value types of settings read from gradfuse.toml, checked by pydantic when the file is read (config.py):
a count is a whole number of at least 1, a number is finite, a string is a string. `k = -3`, `weight = nan`,
`timeout_s = "fast"` or `cors_origins = "x"` are errors that name the key, not surprises later."""

from __future__ import annotations

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
Seconds = Annotated[float, Field(gt=0, strict=True)]
Text = Annotated[str, Field(strict=True)]
Flag = Annotated[bool, Field(strict=True)]
