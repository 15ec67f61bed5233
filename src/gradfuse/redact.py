"""One place that takes secrets out of anything shown: HTTP error bodies and events, /sources, source failures,
the CLI's errors, the server's log, a generator's name. A URL that no parser accepts is still redacted: the
patterns below need no parse.
"""

from __future__ import annotations

import logging
import os
import re

MASK = "***"
SECRET_ENVIRONMENT = ("GRADFUSE_API_KEY", "OPENAI_API_KEY", "PGPASSWORD")
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]*):(?P<secret>[^@\s'\"]*)@")
_KEY_VALUE = re.compile(r"(?P<key>\b(?:password|passwd|pwd|token|api_key|apikey|secret)\s*=\s*)"
                        r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s&;,'\"]+)", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with URL passwords, `password=`/`token=`/`api_key=` values and the values of the secret environment
    variables masked."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    text = _KEY_VALUE.sub(lambda m: f"{m['key']}{MASK}", text)
    for name in SECRET_ENVIRONMENT:
        value = os.environ.get(name, "")
        if len(value) >= 4:  # a one-letter "secret" would mask every occurrence of that letter
            text = text.replace(value, MASK)
    return text


def has_url_password(url: str) -> bool:
    """Whether a URL carries a password, parsable or not."""
    return bool(_URL_PASSWORD.search(url) or _KEY_VALUE.search(url))


class RedactingFilter(logging.Filter):
    """Redacts a log record's message and its traceback before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
