"""`stackfarm qualify`: release sign-off (`--cell --release --approver`, signed with `--key`), its check
(`--verify RECORD [--release NAME]` against `--public-key`), and a new signing key pair (`--keygen DIR`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..attest import (
    PRIVATE_NAME,
    PUBLIC_NAME,
    SIGNING_KEY_ENV,
    TRUSTED_KEYS_ENV,
    generate,
    load_signing_key,
    load_trusted_keys,
)
from ..backends import NAMES
from ..errors import ConfigError, ExitCode
from ..qualify import check_release, qualify, verify


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "qualify", help="sign a cell off as a release, --verify a record, or --keygen a key pair"
    )
    p.add_argument("--cell", help="the cell id to qualify")
    p.add_argument(
        "--release",
        help="the release name (the record's file name); with --verify, the release the record must be",
    )
    p.add_argument("--approver", help="who signs off")
    p.add_argument(
        "--reports",
        type=Path,
        default=None,
        help="the reports folder (reports/; for --verify, the folder above the record's qualifications/)",
    )
    p.add_argument("--matrix", type=Path, default=None, help="the matrix file (matrix.toml)")
    p.add_argument(
        "--backend", choices=NAMES, default="local", help="the backend the run used (it is one of the inputs)"
    )
    p.add_argument(
        "--allow-skip",
        action="append",
        default=[],
        metavar="GLOB",
        help="accept skipped testcases matching SUITE::TESTCASE glob (recorded as not verified)",
    )
    p.add_argument("--replace", action="store_true", help="overwrite an existing record of this release")
    p.add_argument(
        "--key",
        type=Path,
        metavar="PEM",
        help=f"the Ed25519 private key to sign with (default: ${SIGNING_KEY_ENV})",
    )
    p.add_argument("--verify", type=Path, metavar="RECORD", help="check a record against a fresh plan")
    p.add_argument(
        "--public-key",
        type=Path,
        action="append",
        default=[],
        metavar="PEM",
        help=f"a trusted public key (or a folder of them) for --verify; repeatable "
        f"(default: ${TRUSTED_KEYS_ENV})",
    )
    p.add_argument(
        "--keygen",
        type=Path,
        metavar="DIR",
        help=f"write a new key pair: DIR/{PRIVATE_NAME} (0600) and DIR/{PUBLIC_NAME}",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    modes = [f"--{m}" for m in ("keygen", "verify", "cell") if getattr(args, m)]
    if len(modes) > 1:
        raise ConfigError("command line", f"{' and '.join(modes)} together", fix="give one of them")
    if args.keygen:
        return _keygen(args.keygen)
    return _verify(args) if args.verify else _qualify(args)


def _keygen(folder: Path) -> int:
    private, public, key_id = generate(folder)
    print(f"a new Ed25519 key pair, key id {key_id}:")
    print(f"  private: {private} (mode 0600: keep it secret; a CI secret or the approver's machine)")
    print(f"  public:  {public} (commit it where the verifiers find it)")
    print(f"sign with:   stackfarm qualify ... --key {private}   (or {SIGNING_KEY_ENV}={private})")
    print(
        f"verify with: stackfarm qualify --verify RECORD --public-key {public}   (or {TRUSTED_KEYS_ENV}={public})"
    )
    return int(ExitCode.OK)


def _qualify(args: argparse.Namespace) -> int:
    missing = [f"--{k}" for k in ("cell", "release", "approver") if not getattr(args, k)]
    if missing:
        raise ConfigError(
            "command line", f"{', '.join(missing)} missing", fix="give --cell, --release and --approver"
        )
    done = qualify(
        cell_id=args.cell,
        release=args.release,
        approver=args.approver,
        reports=args.reports or Path("reports"),
        matrix_path=args.matrix or Path("matrix.toml"),
        key=load_signing_key(args.key) if args.key else None,
        backend=args.backend,
        allow_skips=args.allow_skip,
        replace=args.replace,
    )
    record = done.predicate
    print(f"qualified {record['cell']} as {record['release']} (approved by {record['approver']})")
    for skip in record["accepted_skips"]:
        print(f"  not verified (accepted): {skip['case']}: {skip['reason']}")
    if record["matrix"].get("modified_since_commit"):
        print(f"  note: {record['matrix']['path']} has uncommitted changes; the record keeps its sha256")
    print(f"{done.path} and {done.path.with_suffix('.md')}; signed by key {done.key_id}")
    return int(ExitCode.OK)


def _verify(args: argparse.Namespace) -> int:
    if args.release is not None:
        check_release(args.release)
    trusted = load_trusted_keys(args.public_key)
    result = verify(args.verify, trusted, args.matrix, args.reports, release=args.release)
    print("\n".join(result.lines))
    return int(ExitCode.OK if result.holds else ExitCode.CELLS_FAILED)


__all__ = ["register", "run"]
