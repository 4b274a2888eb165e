"""Secrets stay secret: redacted wherever a command or a setting is shown, and kept off
command lines (which every local user can read in ``ps``) by private files.

One rule says which keys hold secrets (:func:`is_secret_key`); every printed command line
(:func:`redact_argv`), log line or JSON (:func:`redact_text`) and parameter dict
(:func:`redact_mapping`) goes through it. Launchers put what it matches in a file only this user
can read, under ``$FLOW_HOME/private`` (:func:`new_private_file`, :func:`rewrite_private_file`).
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "REDACTED",
    "is_secret",
    "is_secret_key",
    "new_private_file",
    "private_dir",
    "redact_argv",
    "redact_mapping",
    "redact_text",
    "rewrite_private_file",
]

REDACTED = "***"

#: A key holding any of these (case-insensitive) holds a secret. ``jaas`` is Kafka's
#: ``sasl.jaas.config`` (a login module with its password), ``account.key`` Azure's
#: ``fs.azure.account.key.ACCOUNT...``, ``authorization`` an HTTP header (Iceberg REST
#: ``header.*``).
_WORDS = (
    "secret",
    "password",
    "passwd",
    "passphrase",
    "token",
    "credential",
    "jaas",
    "account.key",
    "authorization",
)
#: ...and so does one ending in ``key``: ``secret.key``, ``access-key``, ``private-key``,
#: ``api_key``.
#: Not ``keystore.type``, ``keyLength`` or ``json.keyfile`` (a path); nor ``s3.access-key-id``
#: or ``AWS_ACCESS_KEY_ID``, which name a key rather than hold it.
_SUFFIXES = ("key",)

_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
_KEY_VALUE = re.compile(r"""(?P<key>[A-Za-z0-9_.\-]+)=(?P<value>"[^"]*"|'[^']*'|[^,;&\s"']*)""")
_JSON_PAIR = re.compile(
    r'"(?P<key>[^"\\]+)"(?P<sep>\s*:\s*)(?P<value>"(?:[^"\\]|\\.)*"|[^,}\]\s]+)'
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*):[^/\s@]+@")


def is_secret_key(key: str) -> bool:
    """Whether a setting named ``key`` (a Spark conf, a catalog property, a variable) is secret."""
    lowered = key.strip().lower()
    return any(word in lowered for word in _WORDS) or lowered.endswith(_SUFFIXES)


def is_secret(key: str, value: str) -> bool:
    """Whether ``key=value`` must stay off command lines: a secret key, or a value that embeds
    one (``-Dx.password=...`` in Java options, a URL with a password)."""
    return is_secret_key(key) or redact_text(value) != value


def _hide_key_value(match: re.Match[str]) -> str:
    key, value = match["key"], match["value"]
    if is_secret_key(key):
        return f"{key}={REDACTED}"
    # `--conf=spark.x.secret=v`: the value holds the pair.
    return f"{key}={redact_text(value)}" if "=" in value else match[0]


def _hide_json_pair(match: re.Match[str]) -> str:
    if not is_secret_key(match["key"]):
        return match[0]
    quote = '"' if match["value"].startswith('"') else ""
    return f'"{match["key"]}"{match["sep"]}{quote}{REDACTED}{quote}'


def redact_text(text: str) -> str:
    """``text`` with the value of each secret ``key=value`` (in ``a=1,b=2`` or ``a=1;b=2``
    lists, ``KEY=value`` variables and Java ``-Dk=v`` options), ``"key": value`` (JSON) and URL
    password replaced by ``***``. A value ends at ``,`` ``;`` ``&`` or whitespace."""
    text = _URL_PASSWORD.sub(rf"\g<head>:{REDACTED}@", text)
    text = _JSON_PAIR.sub(_hide_json_pair, text)
    return _KEY_VALUE.sub(_hide_key_value, text)


def _redact_arg(arg: str) -> str:
    key, sep, value = arg.partition("=")
    if sep and _KEY.fullmatch(key):
        if is_secret_key(key):
            # One argument is one value: a secret with a comma in it is hidden whole.
            return f"{key}={REDACTED}"
        return f"{key}={_redact_arg(value)}"
    return redact_text(arg)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit to print: ``--conf k=v``, ``--conf=k=v``, ``KEY=value``, properties
    lists and ``--password VALUE`` with their secret values replaced by ``***``."""
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        shown.append(REDACTED if hide_next else _redact_arg(arg))
        hide_next = arg.startswith("--") and _KEY.fullmatch(arg) is not None and is_secret_key(arg)
    return shown


def redact_mapping(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``mapping`` (parameters, settings, parsed JSON) with secret values replaced by
    ``***``, nested mappings and lists included."""
    return {
        key: REDACTED if is_secret_key(str(key)) else _redact_value(value)
        for key, value in mapping.items()
    }


def _redact_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return redact_mapping(value)
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    return value


def private_dir(home: Path) -> Path:
    """``$FLOW_HOME/private``, which only this user can list or read (0700)."""
    folder = home / "private"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o077:
        folder.chmod(0o700)
    return folder


def _owner_prefix(pid: int) -> str:
    return f"{pid}@{socket.gethostname()}~"


_OWNER = re.compile(r"(?P<pid>\d+)@(?P<host>[^~]+)~")


def _sweep(folder: Path) -> None:
    """Remove the files of this host's processes that have ended (killed before cleaning up)."""
    host = socket.gethostname()
    for path in folder.iterdir():
        owner = _OWNER.match(path.name)
        if owner and owner["host"] == host and not psutil.pid_exists(int(owner["pid"])):
            path.unlink(missing_ok=True)


def new_private_file(home: Path, text: str, suffix: str = "") -> Path:
    """A new file holding ``text`` that only this user can read (0600), named after this
    process. Delete it when the command that reads it ends; should this process die first, the
    next call on this host removes it."""
    folder = private_dir(home)
    _sweep(folder)
    fd, name = tempfile.mkstemp(prefix=_owner_prefix(os.getpid()), suffix=suffix, dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return Path(name)


def rewrite_private_file(home: Path, name: str, text: str) -> Path:
    """``$FLOW_HOME/private/NAME`` replaced at once by ``text``, readable only by this user:
    for a command this process does not run, so it stays until it is rewritten."""
    folder = private_dir(home)
    fd, staged = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(staged, folder / name)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise
    return folder / name
