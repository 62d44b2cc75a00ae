"""Bearer tokens from a file the operator controls: token -> caller id.

Contract: the file has one ``TOKEN CALLER [ROLE]`` a line (blank lines and ``#`` comments
skipped); the role is ``viewer`` (reads), ``operator`` (reads and calls with an effect: write,
clear, trigger; the open items) or ``admin`` (also acknowledging open items and reading the
audit log), ``DEFAULT_ROLE`` when left out; one caller has one role (two tokens of one caller
with different roles are refused); a token is 16-256 characters of ``[A-Za-z0-9._~+/=-]``, a caller id 1-64 of
``[A-Za-z0-9_.:@-]``; a token given twice is refused. The file must be a regular file (not a
symbolic link) readable by nobody but its owner (mode ``0600`` or ``0400``): a file group or
others may read is refused, so are more than ``MAX_TOKENS`` lines. Any refusal is
``TokenFileError`` naming the line. ``caller_of`` compares in constant time per token.
"""

from __future__ import annotations

import hmac
import os
import re
import stat

from idemlink.protocol.outcome import LocalProtocolError

MAX_TOKENS = 1000
ROLES = ("viewer", "operator", "admin")
"""The roles, each allowed what the one before it is and more."""
DEFAULT_ROLE = "operator"
"""A line without a role: calls with an effect, but no acknowledging and no audit log."""
MAX_FILE_BYTES = 256 * 1024

_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")
_CALLER = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


class TokenFileError(LocalProtocolError, ValueError):
    """The tokens file cannot be used (unsafe, malformed, too big)."""


def load_tokens(path: str | os.PathLike[str]) -> dict[str, str]:
    """token -> caller id of the file at ``path`` (``load_token_file`` with the roles)."""
    return load_token_file(path)[0]


def load_token_file(path: str | os.PathLike[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(token -> caller id, caller id -> role) of the file at ``path``."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise TokenFileError(f"tokens file {p}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"tokens file {p}: not a regular file")
        if st.st_mode & 0o077:
            raise TokenFileError(f"tokens file {p}: group or others may read it (mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        if st.st_size > MAX_FILE_BYTES:
            raise TokenFileError(f"tokens file {p}: over {MAX_FILE_BYTES} bytes")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenFileError(f"tokens file {p}: not UTF-8") from exc
    return parse_token_file(text, p)


def parse_tokens(text: str, name: str = "tokens") -> dict[str, str]:
    return parse_token_file(text, name)[0]


def parse_token_file(text: str, name: str = "tokens") -> tuple[dict[str, str], dict[str, str]]:
    """(token -> caller id, caller id -> role) of a tokens file's text."""
    tokens: dict[str, str] = {}
    roles: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if (len(parts) not in (2, 3) or not _TOKEN.fullmatch(parts[0])
                or not _CALLER.fullmatch(parts[1])):
            raise TokenFileError(f"{name} line {n}: expected `TOKEN CALLER [ROLE]` (a token of "
                                 "16-256 characters, a caller id of 1-64)")
        role = parts[2] if len(parts) == 3 else DEFAULT_ROLE
        if role not in ROLES:
            raise TokenFileError(f"{name} line {n}: role {role[:20]!r} is not one of "
                                 f"{', '.join(ROLES)}")
        if roles.setdefault(parts[1], role) != role:
            raise TokenFileError(f"{name} line {n}: caller {parts[1]} has role "
                                 f"{roles[parts[1]]} on another line: one role a caller")
        if parts[0] in tokens:
            raise TokenFileError(f"{name} line {n}: this token is given twice")
        tokens[parts[0]] = parts[1]
        if len(tokens) > MAX_TOKENS:
            raise TokenFileError(f"{name}: more than {MAX_TOKENS} tokens")
    if not tokens:
        raise TokenFileError(f"{name}: no tokens: nobody could call the gateway")
    return tokens, roles


def allows(role: str, needed: str) -> bool:
    """Whether ``role`` may do what needs ``needed``."""
    return ROLES.index(role) >= ROLES.index(needed)


def caller_of(tokens: dict[str, str], authorization: str | None) -> str | None:
    """The caller id of an ``Authorization: Bearer TOKEN`` header; None if it names none."""
    if authorization is None or not authorization.startswith("Bearer "):
        return None
    # a header that is not UTF-8 arrives with surrogates: never a token, never an exception
    given = authorization[len("Bearer "):].strip().encode(errors="surrogateescape")
    found: str | None = None
    for token, caller in tokens.items():
        if hmac.compare_digest(token.encode(), given):
            found = caller
    return found


__all__ = ["DEFAULT_ROLE", "MAX_TOKENS", "ROLES", "TokenFileError", "allows", "caller_of",
           "load_token_file", "load_tokens", "parse_token_file", "parse_tokens"]
