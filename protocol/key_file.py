"""Long-term keys from a file or the environment: the one reader both the host and the simulated
device use (docs/SECURITY.md "Key life cycle").

A key file holds one key a line, 64 hex digits (32 bytes); blank lines and ``#`` comments are
ignored. The first key is the current one; a device's file may list older keys after it, accepted
during a rotation window (the operator removes them when the window closes). A host uses the first.

The file must be private: a regular file whose mode gives nothing to group or others (0600 or
stricter). A group- or world-accessible file is refused before a byte is read (``KeyFileError``,
one line, naming the file and its mode, never its content). ``IDEMLINK_KEY_FILE`` names such a
file; ``IDEMLINK_KEY`` holds the hex key itself (for a secrets manager that injects environment
variables). Neither the key nor any part of it is ever put in a message.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from idemlink.protocol.frame import KEY_LEN
from idemlink.protocol.outcome import IdemlinkError
from idemlink.protocol.regular_file import FileRefused, read_regular_file, write_regular_file

KEY_FILE_ENV = "IDEMLINK_KEY_FILE"
KEY_ENV = "IDEMLINK_KEY"
MAX_KEY_FILE_BYTES = 4096
MAX_KEYS = 4  #: current key and up to three older ones in a rotation window


class KeyFileError(IdemlinkError, ValueError):
    """A key file or variable refused: absent, not private (group/world access), not a regular
    file, or not lines of 64 hex digits. The message never shows key material."""


def parse_keys(text: bytes, where: str) -> tuple[bytes, ...]:
    """The keys of a key file's text (first: the current one)."""
    keys: list[bytes] = []
    try:
        lines = text.decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise KeyFileError(f"{where}: not ASCII hex; refused") from None
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            key = bytes.fromhex(line)
        except ValueError:
            raise KeyFileError(f"{where}: line {number} is not hex digits; refused") from None
        if len(key) != KEY_LEN:
            raise KeyFileError(f"{where}: line {number} holds {len(key)} bytes, a key is "
                               f"{KEY_LEN} ({2 * KEY_LEN} hex digits); refused")
        keys.append(key)
    if not keys:
        raise KeyFileError(f"{where}: no key in it; refused")
    if len(keys) > MAX_KEYS:
        raise KeyFileError(f"{where}: {len(keys)} keys, at most {MAX_KEYS}; refused")
    return tuple(keys)


def _private(path: str | os.PathLike[str]) -> Callable[[os.stat_result], None]:
    def check(st: os.stat_result) -> None:
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise KeyFileError(f"{os.fspath(path)}: mode {mode:04o} lets group or others read "
                               "or change it; a key file must be 0600 or stricter "
                               f"(chmod 600 {os.fspath(path)}); refused")
    return check


def read_key_file(path: str | os.PathLike[str]) -> tuple[bytes, ...]:
    """The keys of a private key file (see the module docstring); ``KeyFileError`` otherwise."""
    try:
        data = read_regular_file(path, MAX_KEY_FILE_BYTES, follow_symlinks=True,
                                 check=_private(path))
    except FileNotFoundError:
        raise KeyFileError(f"{os.fspath(path)}: no such key file") from None
    except FileRefused as exc:
        raise KeyFileError(str(exc)) from None
    except OSError as exc:
        raise KeyFileError(f"{os.fspath(path)}: {exc.strerror or exc}") from None
    return parse_keys(data, os.fspath(path))


def key_from_environment(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The host's key from ``IDEMLINK_KEY_FILE`` (a private file) or ``IDEMLINK_KEY`` (hex);
    None when neither is set. Both set is refused (which one would be meant?)."""
    keys = keys_from_environment(environ)
    return None if keys is None else keys[0]


def keys_from_environment(environ: Mapping[str, str] | None = None) -> tuple[bytes, ...] | None:
    """Every key of ``IDEMLINK_KEY_FILE`` or ``IDEMLINK_KEY`` (the first one used first; a file
    may list the other key of a rotation after it), None when neither is set."""
    env = os.environ if environ is None else environ
    path, text = env.get(KEY_FILE_ENV), env.get(KEY_ENV)
    if path and text:
        raise KeyFileError(f"both {KEY_FILE_ENV} and {KEY_ENV} are set: keep one; refused")
    if path:
        return read_key_file(Path(path))
    if text:
        return parse_keys(text.encode("ascii", "replace"), KEY_ENV)
    return None


def write_key_file(path: str | os.PathLike[str], keys: tuple[bytes, ...]) -> None:
    """Keep ``keys`` in a 0600 file (the simulated device's flash), replaced atomically."""
    write_regular_file(path, "".join(k.hex() + "\n" for k in keys).encode("ascii"), mode=0o600)


HostKey = bytes | tuple[bytes, ...] | str | os.PathLike[str]
"""What a host is given as its key: one key (32 bytes), the keys of a rotation (the one to use
first, then an older or newer one the device may still hold), or a private key file's path."""


def host_keys(key: HostKey | None) -> tuple[bytes, ...] | None:
    """A host's keys from what it was given (``HostKey``); None: an unkeyed host. A key file is
    read with ``read_key_file`` (private, one key a line); keys of the wrong length are
    ``KeyFileError`` (never showing the bytes)."""
    if key is None:
        return None
    if isinstance(key, bytes):
        keys: tuple[bytes, ...] = (key,)
    elif isinstance(key, tuple):
        keys = key
    else:
        keys = read_key_file(key)
    if not keys or len(keys) > MAX_KEYS:
        raise KeyFileError(f"a host holds 1..{MAX_KEYS} keys, not {len(keys)}; refused")
    for number, k in enumerate(keys, 1):
        if not isinstance(k, bytes) or len(k) != KEY_LEN:
            raise KeyFileError(f"key {number} is not {KEY_LEN} bytes; refused")
    return keys
