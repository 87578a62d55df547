"""Signed attestations: an in-toto Statement (v1) inside a DSSE envelope, signed with an Ed25519 key.

The envelope (DSSE, "Dead Simple Signing Envelope")::

    {"payloadType": "application/vnd.in-toto+json",
     "payload": "<base64 of the statement's JSON bytes>",
     "signatures": [{"keyid": "<sha256 of the public key>", "sig": "<base64 Ed25519 signature>"}]}

What is signed is not the JSON but DSSE's pre-authentication encoding of the payload type and the payload
bytes, so neither can be swapped for another::

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

(SP a space, LEN the length in bytes as ASCII decimal without leading zeros.) A key's id is the sha256 (hex)
of its DER SubjectPublicKeyInfo; the keyid of a signature is only a hint for choosing the key: a signature
counts only when it verifies under a key the verifier trusts.

Keys are configured by path (PEM, PKCS#8 or SubjectPublicKeyInfo; OpenSSH ``ssh-ed25519`` keys work too):

- the private key from ``--key PATH`` or ``$STACKFARM_SIGNING_KEY``; like ssh, a key file that group or others
  may read or write (``mode & 0o077``) is refused (``chmod 600 PATH``), except where files have no modes (Windows);
- the trusted public keys from ``--public-key PATH`` (repeatable) or ``$STACKFARM_TRUSTED_KEYS``
  (paths separated by ``os.pathsep``); a folder stands for every public key file in it.

``generate(DIR)`` writes a new pair: ``DIR/stackfarm-signing.pem`` (private, mode 0600) and
``DIR/stackfarm-signing.pub.pem``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import ConfigError, StackfarmError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SIGNING_KEY_ENV = "STACKFARM_SIGNING_KEY"
TRUSTED_KEYS_ENV = "STACKFARM_TRUSTED_KEYS"
PRIVATE_NAME = "stackfarm-signing.pem"
PUBLIC_NAME = "stackfarm-signing.pub.pem"

_KEYGEN_HINT = (
    f"make a key pair with `stackfarm qualify --keygen DIR`, then pass --key DIR/{PRIVATE_NAME} "
    f"or set {SIGNING_KEY_ENV} to that path"
)
_TRUST_HINT = (
    f"pass --public-key PATH (repeatable) or set {TRUSTED_KEYS_ENV} to the public key files "
    f"(or folders of them), separated by {os.pathsep!r}; `stackfarm qualify --keygen DIR` writes DIR/{PUBLIC_NAME}"
)


class SignatureProblem(StackfarmError):
    """An envelope that does not verify: unknown key, bad signature, edited payload, or not an envelope."""


@dataclass(frozen=True, kw_only=True)
class SigningKey:
    private: Ed25519PrivateKey
    key_id: str
    path: Path


@dataclass(frozen=True, kw_only=True)
class TrustedKey:
    public: Ed25519PublicKey
    key_id: str
    path: Path


@dataclass(frozen=True, kw_only=True)
class Opened:
    """A verified envelope: the statement it carries and the trusted key whose signature holds."""

    statement: dict[str, Any]
    key: TrustedKey


# --------------------------------------------------------------------------- DSSE


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: the bytes a signature covers."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def key_id(public: Ed25519PublicKey) -> str:
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _b64decode(text: object, what: str) -> bytes:
    """Standard or URL-safe base64 (DSSE allows either), padding optional; strict otherwise."""
    if not isinstance(text, str):
        raise SignatureProblem(f"the envelope's {what} is not a base64 string")
    normal = text.replace("-", "+").replace("_", "/")
    normal += "=" * (-len(normal) % 4)
    try:
        return base64.b64decode(normal, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureProblem(f"the envelope's {what} is not valid base64") from None


def canonical_json(value: Any) -> bytes:
    """The payload bytes: sorted keys, no insignificant whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sign(payload: bytes, key: SigningKey, payload_type: str = PAYLOAD_TYPE) -> dict[str, Any]:
    """A DSSE envelope of `payload`, signed by `key`."""
    sig = key.private.sign(pae(payload_type, payload))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [{"keyid": key.key_id, "sig": base64.b64encode(sig).decode("ascii")}],
    }


def is_envelope(doc: object) -> bool:
    return isinstance(doc, Mapping) and {"payloadType", "payload", "signatures"} <= set(doc)


def unverified_payload(envelope: Mapping[str, Any]) -> bytes:
    """The payload bytes, signature NOT checked (for showing what a refused envelope claims)."""
    return _b64decode(envelope.get("payload"), "payload")


def open_envelope(envelope: Mapping[str, Any], trusted: Sequence[TrustedKey]) -> Opened:
    """The statement of an envelope one of whose signatures verifies under a trusted key; else
    SignatureProblem saying why (no signature, an unknown key, a signature that does not match)."""
    if not is_envelope(envelope):
        raise SignatureProblem("not a DSSE envelope (payloadType, payload, signatures)")
    payload_type = envelope["payloadType"]
    if payload_type != PAYLOAD_TYPE:
        raise SignatureProblem(f"payloadType {payload_type!r}, not {PAYLOAD_TYPE!r}")
    payload = unverified_payload(envelope)
    signatures = envelope["signatures"]
    if not isinstance(signatures, list) or not signatures:
        raise SignatureProblem("the envelope carries no signature")
    message = pae(payload_type, payload)
    unknown: list[str] = []
    for entry in signatures:
        if not isinstance(entry, Mapping):
            continue
        keyid = entry.get("keyid")
        sig = _b64decode(entry.get("sig"), "signature")
        # The keyid is unauthenticated: it only picks the key to try; a signature naming none tries them all.
        candidates = [k for k in trusted if k.key_id == keyid] if keyid else list(trusted)
        if not candidates:
            unknown.append(str(keyid))
        for key in candidates:
            try:
                key.public.verify(sig, message)
            except InvalidSignature:
                continue
            return Opened(statement=_statement(payload), key=key)
    if len(unknown) == len(signatures):
        known = ", ".join(f"{k.key_id[:16]}… ({k.path})" for k in trusted)
        raise SignatureProblem(
            f"signed by key {', '.join(u[:16] + '…' for u in unknown)}, which is not a trusted key "
            f"(trusted: {known})"
        )
    raise SignatureProblem(
        "the signature does not match the payload: the record was changed after it was signed"
    )


def _statement(payload: bytes) -> dict[str, Any]:
    try:
        statement = json.loads(payload)
    except ValueError as exc:
        raise SignatureProblem(f"the signed payload is not JSON ({exc})") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise SignatureProblem(f"the signed payload is not an in-toto Statement ({STATEMENT_TYPE})")
    if not isinstance(statement.get("subject"), list) or not isinstance(statement.get("predicate"), dict):
        raise SignatureProblem("the signed statement has no subject list or no predicate")
    return statement


def statement(subjects: Sequence[Mapping[str, Any]], predicate_type: str, predicate: Any) -> dict[str, Any]:
    """An in-toto Statement v1; each subject is {"name": ..., "digest": {"sha256": ...}}."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [dict(s) for s in subjects],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


# --------------------------------------------------------------------------- keys


def generate(folder: Path) -> tuple[Path, Path, str]:
    """A new Ed25519 pair in `folder`: (private key path (0600), public key path, key id). Never overwrites."""
    private_path, public_path = folder / PRIVATE_NAME, folder / PUBLIC_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise ConfigError(path, "exists: a key pair is never overwritten", fix="choose another folder")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    private_path.chmod(0o600)
    public = key.public_key()
    public_path.write_bytes(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private_path, public_path, key_id(public)


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(path, f"cannot read the key ({exc.strerror or exc})", fix=f"check {flag}") from None


def _has_modes() -> bool:
    """Whether file modes say who may read a file here (POSIX); Windows keeps that in ACLs instead."""
    return os.name != "nt"


def _read_private(path: Path, flag: str) -> tuple[bytes, int]:
    """The key file's bytes and its permission bits, both of the one file opened (not a path re-resolved)."""
    try:
        with path.open("rb") as fh:
            mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
            return fh.read(), mode
    except OSError as exc:
        raise ConfigError(path, f"cannot read the key ({exc.strerror or exc})", fix=f"check {flag}") from None


def _exposed(path: Path, mode: int) -> ConfigError | None:
    """A private key that group or others may read or write is refused, as ssh refuses one: whoever else
    reads it can sign sign-offs in the approver's name. Not checked where files have no modes."""
    if not _has_modes() or not mode & 0o077:
        return None
    return ConfigError(
        path,
        f"the private key is accessible by group or others (mode {mode:04o}): a signing key must be "
        "readable by its owner alone; anyone else who can read it can sign in the approver's name",
        fix=f"chmod 600 {shlex.quote(str(path))}",
    )


def load_signing_key(path: Path | None = None) -> SigningKey:
    """The private key from `path`, else from $STACKFARM_SIGNING_KEY; ConfigError (exit 2) when neither, and
    when group or others may read or write the key file (``chmod 600`` it; not checked on Windows)."""
    if path is None:
        env = os.environ.get(SIGNING_KEY_ENV, "").strip()
        if not env:
            raise ConfigError(
                "--key",
                "no signing key: a qualification record is signed with an Ed25519 key",
                fix=_KEYGEN_HINT,
            )
        path = Path(env).expanduser()
    data, mode = _read_private(path, f"--key / {SIGNING_KEY_ENV}")
    key = _private_key(data, path)
    exposed = _exposed(path, mode)
    if exposed is not None:
        raise exposed
    return SigningKey(private=key, key_id=key_id(key.public_key()), path=path)


def signing_key_from_text(text: str, where: str) -> SigningKey:
    """A private key given as its PEM (or OpenSSH) text, e.g. a CI secret in an environment variable named
    `where` (which stands for the key's path in messages): it never touches a disk."""
    origin = Path(where)
    key = _private_key(text.encode("utf-8"), origin)
    return SigningKey(private=key, key_id=key_id(key.public_key()), path=origin)


def _private_key(data: bytes, path: Path) -> Ed25519PrivateKey:
    try:
        if b"OPENSSH PRIVATE KEY" in data:
            key: object = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(
            path, "the private key is encrypted; stackfarm reads unencrypted keys", fix=_KEYGEN_HINT
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(path, f"not a PEM private key ({exc})", fix=_KEYGEN_HINT) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(path, f"a {type(key).__name__}, not an Ed25519 private key", fix=_KEYGEN_HINT)
    return key


def _public(path: Path, data: bytes) -> TrustedKey:
    if b"PRIVATE KEY" in data:
        raise ConfigError(
            path, "a private key: trust its public half instead", fix=f"give the {PUBLIC_NAME} file"
        )
    try:
        if data.lstrip().startswith(b"ssh-"):
            key: object = serialization.load_ssh_public_key(data)
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(path, f"not a public key ({exc})", fix=_TRUST_HINT) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(path, f"a {type(key).__name__}, not an Ed25519 public key", fix=_TRUST_HINT)
    return TrustedKey(public=key, key_id=key_id(key), path=path)


def load_trusted_keys(paths: Sequence[Path] = ()) -> tuple[TrustedKey, ...]:
    """The public keys `paths` name, else those of $STACKFARM_TRUSTED_KEYS; a folder gives every public
    key file in it (private keys there are passed over). ConfigError (exit 2) when there is none."""
    if not paths:
        env = os.environ.get(TRUSTED_KEYS_ENV, "")
        paths = [Path(p).expanduser() for p in env.split(os.pathsep) if p.strip()]
    keys: list[TrustedKey] = []
    for path in paths:
        if path.is_dir():
            for file in sorted(p for p in path.iterdir() if p.is_file()):
                data = _read(file, "--public-key")
                if b"PUBLIC KEY" in data or data.lstrip().startswith(b"ssh-ed25519 "):
                    keys.append(_public(file, data))
        else:
            keys.append(_public(path, _read(path, f"--public-key / {TRUSTED_KEYS_ENV}")))
    if not keys:
        where = f" in {', '.join(map(str, paths))}" if paths else ""
        raise ConfigError(
            "--public-key", f"no trusted public key{where} to check the signature with", fix=_TRUST_HINT
        )
    return tuple({k.key_id: k for k in keys}.values())


__all__ = [
    "PAYLOAD_TYPE",
    "PRIVATE_NAME",
    "PUBLIC_NAME",
    "SIGNING_KEY_ENV",
    "STATEMENT_TYPE",
    "TRUSTED_KEYS_ENV",
    "Opened",
    "SignatureProblem",
    "SigningKey",
    "TrustedKey",
    "canonical_json",
    "generate",
    "is_envelope",
    "key_id",
    "load_signing_key",
    "load_trusted_keys",
    "open_envelope",
    "pae",
    "sign",
    "signing_key_from_text",
    "statement",
    "unverified_payload",
]
