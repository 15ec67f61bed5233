"""One place that takes secrets out of anything shown: HTTP error bodies and events, /sources, source failures,
the CLI's errors, the server's log, a generator's name.

Masks go by structure first: a URL's whole userinfo (user and password, whatever characters the password holds,
parsable or not) and the value after a secret-looking key (`password=`, `"token": ...`). The values of the secret
environment variables are masked as well, except in what answers a client's own bad input (`environment=False`):
there a value-based mask would tell a client which of its guesses is the secret.
"""

from __future__ import annotations

import logging
import os
import re

MASK = "***"
SECRET_ENVIRONMENT = ("GRADFUSE_API_KEY", "OPENAI_API_KEY", "PGPASSWORD")
# Everything between "scheme://" and the last "@" before the next URL or the end of the line is userinfo: a
# password may hold quotes, spaces, '/' or a stray '%' that no URL parser accepts. Masking too much of an odd line
# is the safe mistake.
_SCHEME = r"\b[a-zA-Z][a-zA-Z0-9+.-]*://"
_URL_USERINFO = re.compile(rf"(?P<head>{_SCHEME})(?P<userinfo>(?:(?!{_SCHEME})[^\n]){{0,512}})@")
_KEY_VALUE = re.compile(r"(?P<key>[\"']?\b(?:password|passwd|pwd|token|api_key|apikey|secret)[\"']?\s*[=:]\s*)"
                        r"(?P<value>'[^']*'|\"(?:[^\"\\]|\\.)*\"|[^\s&;,]+)", re.IGNORECASE)
_QUOTED = re.compile(r"\"[^\"\n]*\"")


_ADDRESS = re.compile(rf"{_SCHEME}[^\s)\]\"'<>,;]+")


def without_addresses(text: str) -> str:
    """`text` with every URL (an engine's, a database's, a remote gradfuse's) replaced: where the workspace's
    sources live is not for every key to know."""
    return _ADDRESS.sub("<its address>", text)


def redact(text: str, *, environment: bool = True) -> str:
    """`text` with URL userinfo, secret key values and (with `environment`) the secret environment variables'
    values masked."""
    text = _URL_USERINFO.sub(lambda m: f"{m['head']}{MASK}@", text)
    text = _KEY_VALUE.sub(lambda m: f"{m['key']}{MASK}", text)
    if environment:
        for name in SECRET_ENVIRONMENT:
            value = os.environ.get(name, "")
            if len(value) >= 4:  # a one-letter "secret" would mask every occurrence of that letter
                text = text.replace(value, MASK)
    return text


def has_url_password(url: str) -> bool:
    """Whether a URL carries a password, parsable or not."""
    userinfo = _URL_USERINFO.search(url)
    return bool((userinfo and ":" in userinfo["userinfo"]) or _KEY_VALUE.search(url))


def driver_message(error: BaseException) -> str:
    """A database driver's error as one line that is safe to show: libpq quotes pieces of the connection string it
    could not parse ('invalid percent-encoded token: "pc%zz-..."'), so every quoted piece is dropped."""
    lines = str(error).strip().splitlines()
    return redact(_QUOTED.sub('"…"', lines[0] if lines else type(error).__name__))


class RedactingFilter(logging.Filter):
    """Redacts a log record's message and its traceback before any handler formats it. The arguments are kept
    (uvicorn's access formatter unpacks them) and masked one by one; the message template is masked as text."""

    def filter(self, record: logging.LogRecord) -> bool:
        template = redact(str(record.msg))
        if template.count("%") != str(record.msg).count("%"):  # a mask took a placeholder: mask the whole line
            record.msg, record.args = redact(record.getMessage()), ()
        else:
            record.msg = template
            if isinstance(record.args, tuple):
                record.args = tuple(_masked(a) for a in record.args)
            elif isinstance(record.args, dict):
                record.args = {key: _masked(value) for key, value in record.args.items()}
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def _masked(argument):
    """A log argument with its secrets masked; numbers stay numbers (a formatter may ask for %d)."""
    return argument if argument is None or isinstance(argument, (int, float)) else redact(str(argument))
