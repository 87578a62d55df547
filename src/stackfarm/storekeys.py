"""Who may speak for a verdict in the shared store: the runner's own signing key and the runner keys a reader
trusts, and the signed form of a store entry's manifest.

A store is only as trustworthy as whoever can write to it. So a runner signs each entry it pushes with its
Ed25519 runner key, and a reader reuses or merges an entry only when its manifest is a DSSE envelope whose
signature verifies under a trusted runner key (stackfarm.attest's machinery, the one sign-off uses). What is
signed is an in-toto Statement whose subjects are the entry's files (name, sha256) and whose predicate names
the cell, the input hash, the run, the upload folder and the file list: a file swapped, an entry moved to
another key or another cell, a field added beside the envelope, or a manifest from a key nobody trusts is
refused, named, and counts as missing.

Keys, by path (PEM or OpenSSH; `stackfarm qualify --keygen DIR` makes a pair):

- the runner's private key: ``$STACKFARM_RUNNER_KEY``, a path or the PEM text itself (a CI secret; a run that
  pushes needs one);
- the trusted runner public keys: ``$STACKFARM_TRUSTED_RUNNER_KEYS`` (files or folders, separated by
  ``os.pathsep``), plus the public half of the runner's own key (a runner trusts what it signed itself).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import attest
from .attest import SignatureProblem, SigningKey, TrustedKey
from .errors import ConfigError

RUNNER_KEY_ENV = "STACKFARM_RUNNER_KEY"
TRUSTED_RUNNER_KEYS_ENV = "STACKFARM_TRUSTED_RUNNER_KEYS"
#: The predicate type of a signed store manifest.
PREDICATE_TYPE = "https://stackfarm.dev/store-entry/v2"
#: The manifest's format inside the signed predicate.
FORMAT = 2
#: The keys a manifest file may have: the envelope's own, nothing unsigned beside them.
ENVELOPE_KEYS = frozenset({"payloadType", "payload", "signatures"})

SETUP_HINT = (
    f"make a runner key with `stackfarm qualify --keygen DIR`, set {RUNNER_KEY_ENV}=DIR/{attest.PRIVATE_NAME} "
    f"on each runner (a CI secret), and {TRUSTED_RUNNER_KEYS_ENV} to the runners' public keys (files or a "
    "folder of them) on every reader"
)


class Untrusted(Exception):
    """A manifest no trusted runner key vouches for (unsigned, unknown key, bad signature, unsigned fields)."""


@dataclass(frozen=True, kw_only=True)
class StoreKeys:
    """The runner's signing key (None: this runner cannot push) and the runner keys it trusts."""

    signer: SigningKey | None
    trusted: tuple[TrustedKey, ...]

    def describe(self) -> str:
        """One line for messages: which keys this reader trusts."""
        if not self.trusted:
            return "no trusted runner key"
        return "trusted runner keys: " + ", ".join(f"{k.key_id[:16]}… ({k.path})" for k in self.trusted)


def _paths(env: str) -> list[Path]:
    return [Path(p).expanduser() for p in os.environ.get(env, "").split(os.pathsep) if p.strip()]


def load(extra_trusted: Sequence[Path] = ()) -> StoreKeys:
    """The keys from the environment (and `extra_trusted` public keys); ConfigError naming a bad key file."""
    signer = None
    given = os.environ.get(RUNNER_KEY_ENV, "").strip()
    if "PRIVATE KEY-----" in given:  # the key itself (a CI secret), not a path
        signer = attest.signing_key_from_text(given, f"${RUNNER_KEY_ENV}")
    elif given:
        signer = attest.load_signing_key(Path(given).expanduser())
    trusted: list[TrustedKey] = []
    paths = [*_paths(TRUSTED_RUNNER_KEYS_ENV), *extra_trusted]
    if paths:
        try:
            trusted.extend(attest.load_trusted_keys(paths))
        except ConfigError as exc:
            raise ConfigError(TRUSTED_RUNNER_KEYS_ENV, f"{exc}".splitlines()[0], fix=SETUP_HINT) from None
    if signer is not None:
        public = signer.private.public_key()
        trusted.append(TrustedKey(public=public, key_id=signer.key_id, path=signer.path))
    return StoreKeys(signer=signer, trusted=tuple({k.key_id: k for k in trusted}.values()))


def seal(predicate: Mapping[str, Any], key: SigningKey) -> dict[str, Any]:
    """The signed manifest: a DSSE envelope of a Statement over the entry's files."""
    files = predicate["files"]
    subjects = [{"name": name, "digest": {"sha256": meta["sha256"]}} for name, meta in sorted(files.items())]
    statement = attest.statement(subjects, PREDICATE_TYPE, dict(predicate))
    return attest.sign(attest.canonical_json(statement), key)


def unseal(doc: object, keys: StoreKeys) -> tuple[dict[str, Any], TrustedKey]:
    """The manifest's predicate and the key that signed it; Untrusted saying why it cannot be believed."""
    if not attest.is_envelope(doc):
        raise Untrusted(
            "unsigned: the manifest is not a signed envelope (an entry of an older stackfarm, or "
            "one written by hand)"
        )
    assert isinstance(doc, Mapping)  # is_envelope says so
    extra = sorted(set(doc) - ENVELOPE_KEYS)
    if extra:
        raise Untrusted(f"unsigned fields beside the signed envelope: {', '.join(map(str, extra))}")
    if not keys.trusted:
        raise Untrusted(
            f"no trusted runner key to check its signature with ({TRUSTED_RUNNER_KEYS_ENV} is unset)"
        )
    try:
        opened = attest.open_envelope(doc, keys.trusted)
    except SignatureProblem as exc:
        raise Untrusted(str(exc)) from None
    statement = opened.statement
    predicate = statement["predicate"]
    if statement.get("predicateType") != PREDICATE_TYPE or predicate.get("format") != FORMAT:
        raise Untrusted(f"the signed statement is not a store manifest ({PREDICATE_TYPE}, format {FORMAT})")
    files = predicate.get("files")
    subjects = {
        str(s.get("name")): (s.get("digest") or {}).get("sha256")
        for s in statement["subject"]
        if isinstance(s, Mapping)
    }
    if not isinstance(files, Mapping) or subjects != {
        str(n): (m.get("sha256") if isinstance(m, Mapping) else None) for n, m in files.items()
    }:
        raise Untrusted("the signed subjects and the manifest's file list differ")
    return dict(predicate), opened.key


__all__ = [
    "ENVELOPE_KEYS",
    "FORMAT",
    "PREDICATE_TYPE",
    "RUNNER_KEY_ENV",
    "SETUP_HINT",
    "TRUSTED_RUNNER_KEYS_ENV",
    "StoreKeys",
    "Untrusted",
    "load",
    "seal",
    "unseal",
]
