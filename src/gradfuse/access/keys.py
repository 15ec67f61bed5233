"""Keys and the principals they stand for (`[access]` in gradfuse.toml, and a key file the server reads again when
it changes). A key is kept only as its SHA-256: a file of principals can be committed or shared without a key in it.

    [access]
    keys_file = "keys.toml"          # [principals.NAME] tables as below, read again when the file changes
    [access.principals.alice]
    key_sha256 = "…"                 # or key_env = "ALICE_KEY": the variable that holds the key
    groups = ["hr"]
    sources = ["handbook", "hr"]     # ["*"]: every source
    every_document = false           # true: reads documents whoever they are meant for (an auditor)

The server's single key (GRADFUSE_API_KEY, `[server] api_key`) stays what it was: it may read everything."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from gradfuse.access import EVERYTHING, Principal, check_reader
from gradfuse.checked import FILE_SETTINGS, Flag, Text
from gradfuse.checked import check_source_name

log = logging.getLogger("gradfuse.access")
_HEX = frozenset("0123456789abcdef")


class AccessError(ValueError):
    """An `[access]` table or a key file that cannot be used; the message names the principal and the key at fault."""


def key_hash(key: str | bytes) -> str:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


@dataclass(frozen=True)
class PrincipalSettings:
    __pydantic_config__ = FILE_SETTINGS
    sources: tuple[Text, ...]  # the sources it may read; ["*"]: every one
    groups: tuple[Text, ...] = ()
    key_sha256: Text = ""
    key_env: Text = ""
    every_document: Flag = False

    def __post_init__(self):
        if bool(self.key_sha256) == bool(self.key_env):
            raise ValueError("give exactly one of key_sha256 (the key's SHA-256, as `gradfuse key add` writes it) "
                             "and key_env (the variable that holds the key)")
        if self.key_sha256 and (len(self.key_sha256) != 64 or not set(self.key_sha256) <= _HEX):
            raise ValueError("key_sha256 must be 64 lower-case hexadecimal digits")
        for group in self.groups:
            check_reader(group)
        if "*" not in self.sources:
            for source in self.sources:
                check_source_name(source)

    def principal(self, name: str) -> Principal:
        return Principal(name=check_reader(name), groups=frozenset(self.groups),
                         sources=None if "*" in self.sources else frozenset(self.sources),
                         every_document=self.every_document)

    def hash(self) -> str | None:
        """The key's hash; None where its variable is unset (the principal cannot sign in, and a log line says so)."""
        if self.key_sha256:
            return self.key_sha256
        value = os.environ.get(self.key_env)
        return key_hash(value) if value else None


@dataclass(frozen=True)
class AccessSettings:
    """`[access]` in gradfuse.toml."""

    __pydantic_config__ = FILE_SETTINGS
    keys_file: Text = ""  # relative to the config file
    principals: dict[Text, PrincipalSettings] = field(default_factory=dict)


def parse_principals(table: object, where: str) -> dict[str, PrincipalSettings]:
    try:
        principals = TypeAdapter(dict[Text, PrincipalSettings]).validate_python(table)
        for name in principals:
            check_reader(name)
        return principals
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                             for e in error.errors())
        raise AccessError(f"{where}: {problems}") from None
    except ValueError as error:
        raise AccessError(f"{where}: {error}") from None


def read_key_file(path: Path) -> dict[str, PrincipalSettings]:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise AccessError(f"key file {path}: {error}") from None
    unknown = set(raw) - {"principals"}
    if unknown:
        raise AccessError(f"key file {path}: unknown keys {sorted(unknown)} (it holds [principals.NAME] tables)")
    return parse_principals(raw.get("principals", {}), f"key file {path}")


def keys_required(api_key: str | None, access: AccessSettings) -> bool:
    """Whether requests need a key: one is configured (the single one, a principal, or a key file), whether or not
    it can sign in (principals whose variables are unset must not leave the server open to everyone)."""
    return bool(api_key or access.principals or access.keys_file)


class KeyRing:
    """Key → principal, for the server. The key file is read again when it changes (its size, time or inode); while
    it cannot be read, none of its keys is accepted (a revoked key must not live on through a typo), and the error
    is logged once."""

    def __init__(self, api_key: str | None, access: AccessSettings):
        self._fixed: dict[str, Principal] = {}
        self.required = keys_required(api_key, access)
        self._config_names = set(access.principals)
        if api_key:
            self._fixed[key_hash(api_key)] = EVERYTHING
        for name, settings in access.principals.items():
            self._add(self._fixed, name, settings, "[access.principals]")
        self._file = Path(access.keys_file) if access.keys_file else None
        self._stamp, self._from_file = ("not read yet",), {}  # not None: a file missing at start is logged too
        self._lock = threading.Lock()
        self._reload()

    def principal(self, key: bytes) -> Principal | None:
        if not key:
            return None
        self._reload()
        hashed = key_hash(key)
        return self._fixed.get(hashed) or self._from_file.get(hashed)

    def _add(self, ring: dict[str, Principal], name: str, settings: PrincipalSettings, where: str) -> None:
        hashed = settings.hash()
        if hashed is None:
            log.warning("%s: principal %s cannot sign in: %s is not set", where, name, settings.key_env)
        elif hashed in self._fixed or hashed in ring:
            raise AccessError(f"{where}: principal {name}'s key is another principal's too")
        else:
            ring[hashed] = settings.principal(name)

    def _reload(self) -> None:
        if self._file is None:
            return
        try:
            info = os.stat(self._file)
            stamp = (info.st_mtime_ns, info.st_ctime_ns, info.st_size, info.st_ino)  # ctime: a chmod that fixed it
        except OSError as error:
            stamp, why = None, error.strerror
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            ring: dict[str, Principal] = {}
            try:
                if stamp is None:
                    raise AccessError(f"key file {self._file} cannot be read ({why})")
                for name, settings in read_key_file(self._file).items():
                    if name in self._config_names:  # two keys with different rights for one name
                        raise AccessError(f"key file {self._file}: principal {name} is in [access.principals] too")
                    self._add(ring, name, settings, f"key file {self._file}")
            except AccessError as error:
                log.error("%s: none of its keys is accepted until it is fixed", error)
                ring = {}
            self._from_file, self._stamp = ring, stamp
