"""API keys: the key file (hashes only), its parser, the live key table, and a key generator.

The file holds one key per line:

    KEY_ID SHA256_HEX [models=a,b|*] [rpm=N] [tpm=N] [input_tpm=N] [output_tpm=N] [characters=N]

(`characters`: the key's character quota, DeepL's character_limit: texts translated beyond it
are refused; counted per server process since it started, see server/security/usage.py.)

Blank lines and `#` comments (whole-line or trailing) are ignored. The server never
sees a plain key at rest: a leaked key file (a backup, a ConfigMap dump, a log of
`kubectl describe`) gives an attacker nothing to call the service with. Clients send
the key itself; the server hashes it and compares digests in constant time.

Generate a key and its line (the key is printed once and stored nowhere):

    python -m server.security.keys new alice --models multi30k-en-de-small --rpm 600
    python -m server.security.keys hash alice < key.txt      # the line for an existing key
    python -m server.security.keys check keys.txt            # validate a file
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger(__name__)

# Key ids appear in logs and as a Prometheus label value: keep them short and plain.
KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}\Z")
RESERVED_IDS = {"other"}  # the metrics label for ids beyond the label cap
RATE_FIELDS = ("rpm", "tpm", "input_tpm", "output_tpm")
LIMIT_FIELDS = RATE_FIELDS + ("characters",)
KEY_PREFIX = "nmt_"  # generated keys are recognisable in a secret scanner's rules


@dataclass(frozen=True)
class Limits:
    """Per-key budgets per minute, and a character quota; 0 = unlimited. tpm counts input and output
    tokens together."""
    rpm: int = 0
    tpm: int = 0
    input_tpm: int = 0
    output_tpm: int = 0
    characters: int = 0

    @property
    def any(self) -> bool:
        """Any per-minute rate limit (the token buckets of ratelimit.py)."""
        return any((self.rpm, self.tpm, self.input_tpm, self.output_tpm))


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    digest: bytes = field(repr=False)  # SHA-256 of the key
    models: Optional[frozenset] = None  # None = every model
    limits: Limits = Limits()

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models


class KeyFileError(ValueError):
    """A key file that cannot be used; `problems` lists every bad line (the message joins them)."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyTable:
    """The keys of one version of the file. Immutable: a reload builds a new table and swaps it in."""

    def __init__(self, keys: Sequence[ApiKey] = ()):
        self.keys = tuple(keys)
        self.ids = frozenset(k.key_id for k in self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, key: str) -> Optional[ApiKey]:
        """The record whose digest matches the presented key, or None.

        Every record is compared, with hmac.compare_digest, and the loop never exits early:
        neither which record matched nor how many leading bytes agreed shows in the timing.
        A dict lookup by digest would be faster, but a few hundred 32-byte comparisons cost
        microseconds, far below one decode step.
        """
        presented = digest_of(key)
        found = None
        for record in self.keys:
            if hmac.compare_digest(presented, record.digest) and found is None:
                found = record
        return found


def _parse_fields(tokens: Sequence[str], where: str, problems: list[str]) -> tuple[Optional[frozenset], Limits]:
    models: Optional[frozenset] = None
    limits: dict[str, int] = {}
    seen: set[str] = set()
    for token in tokens:
        name, eq, value = token.partition("=")
        if not eq:
            problems.append(f"{where}: expected NAME=VALUE, got {token!r}")
            continue
        if name in seen:
            problems.append(f"{where}: {name} given twice")
            continue
        seen.add(name)
        if name == "models":
            names = [m for m in value.split(",") if m]
            if not names:
                problems.append(f"{where}: models= lists no model (use models=* for all)")
            models = None if names == ["*"] else frozenset(names)
        elif name in LIMIT_FIELDS:
            if not value.isdigit():
                problems.append(f"{where}: {name} must be a whole number >= 0 (got {value!r})")
            else:
                limits[name] = int(value)
        else:
            problems.append(f"{where}: unknown field {name!r} (known: models, {', '.join(LIMIT_FIELDS)})")
    return models, Limits(**limits)


def parse_key_file(text: str, source: str = "the key file") -> KeyTable:
    """Parse a whole file, collecting every problem before refusing it (an operator fixes them in one go)."""
    problems: list[str] = []
    keys: list[ApiKey] = []
    first_line: dict[str, int] = {}
    by_digest: dict[bytes, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {number}"
        tokens = line.split()
        if len(tokens) < 2:
            problems.append(f"{where}: expected 'KEY_ID SHA256_HEX [fields]'")
            continue
        key_id, hex_digest = tokens[0], tokens[1]
        ok = True
        if not KEY_ID.match(key_id) or key_id in RESERVED_IDS:
            problems.append(f"{where}: bad key id {key_id[:70]!r} (letters, digits, '.', '_', '-'; at most 64; "
                            f"not {', '.join(sorted(RESERVED_IDS))})")
            ok = False
        if not HEX_DIGEST.match(hex_digest):
            # Most likely a plain key pasted where its hash belongs: say so, but never echo it.
            problems.append(f"{where}: the second field must be the key's SHA-256 as 64 hex digits "
                            f"(got {len(hex_digest)} characters; the file holds hashes, never keys)")
            ok = False
        models, limits = _parse_fields(tokens[2:], where, problems)
        if not ok:
            continue
        if key_id in first_line:
            problems.append(f"{where}: key id {key_id!r} already used on line {first_line[key_id]}")
            continue
        digest = bytes.fromhex(hex_digest)
        if digest in by_digest:
            problems.append(f"{where}: the same key hash as line {by_digest[digest]} (one key, one id)")
            continue
        first_line[key_id], by_digest[digest] = number, number
        keys.append(ApiKey(key_id, digest, models, limits))
    if problems:
        raise KeyFileError(problems)
    return KeyTable(keys)


def load_key_file(path: str | Path) -> KeyTable:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KeyFileError([f"--api-keys-file {path}: cannot be read ({e})"]) from None
    return parse_key_file(text, str(path))


class KeyStore:
    """The live table of a key file. reload() swaps in a new table only when the whole file parses:
    a half-edited file must not lock every client out (or, worse, let a removed key back in)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.table = load_key_file(self.path)

    def find(self, key: str) -> Optional[ApiKey]:
        return self.table.find(key)

    def reload(self) -> tuple[bool, str]:
        """(True, summary) after a good reload; (False, why) when the old keys stay."""
        try:
            table = load_key_file(self.path)
        except KeyFileError as e:
            return False, str(e)
        added, removed = table.ids - self.table.ids, self.table.ids - table.ids
        self.table = table
        return True, f"{len(table)} keys ({len(added)} added, {len(removed)} removed)"


# -- generating keys --------------------------------------------------------------------

def new_key() -> str:
    """256 random bits, URL-safe: fits an HTTP header without quoting."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def file_line(key_id: str, key: str, models: Sequence[str] = (), **limits: int) -> str:
    """The key file line for `key` (its hash, never the key)."""
    parts = [key_id, hashlib.sha256(key.encode("utf-8")).hexdigest()]
    if models:
        parts.append("models=" + ",".join(models))
    parts += [f"{name}={limits[name]}" for name in LIMIT_FIELDS if limits.get(name)]
    line = " ".join(parts)
    parse_key_file(line, "the generated line")  # the same rules as the server: fail here, not at start-up
    return line


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m server.security.keys", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, what in (("new", "make a key: prints the key (once) and its key-file line"),
                       ("hash", "the key-file line for an existing key read from stdin")):
        s = sub.add_parser(name, help=what)
        s.add_argument("key_id")
        s.add_argument("--models", default="", help="comma-separated models the key may use (default: all)")
        for limit in LIMIT_FIELDS:
            s.add_argument("--" + limit.replace("_", "-"), type=int, default=0, help=f"{limit} (0 = unlimited)")
    c = sub.add_parser("check", help="validate a key file")
    c.add_argument("file")
    args = p.parse_args(argv)
    try:
        if args.cmd == "check":
            print(f"{args.file}: {len(load_key_file(args.file))} keys, OK")
            return 0
        models = [m for m in args.models.split(",") if m]
        limits = {name: getattr(args, name) for name in LIMIT_FIELDS}
        if args.cmd == "new":
            key = new_key()
            print(f"# the key for {args.key_id} (shown once; give it to the client), then its line for "
                  f"--api-keys-file:", file=sys.stderr)
            line = file_line(args.key_id, key, models, **limits)
            print(key)
            print(line)
        else:
            key = sys.stdin.readline().strip()
            if not key:
                print("error: no key on stdin", file=sys.stderr)
                return 2
            print(file_line(args.key_id, key, models, **limits))
    except KeyFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
