"""`stackfarm bundle CELL --wheelhouse OUT`: every wheel a cell and its suites need on a host that reaches no index.

The host is described by a profile (stackfarm.profile): its Python and platform, what it already provides, the
pins it needs, what it deliberately lacks ([[deviation]]) and what is deliberately not carried (leave_out).

1. What is asked for: the cell's stack (an `absent` deviation left out), each enabled suite's `wheels`
   ([suites.<NN-name>] wheels, `{cuda_major}` filled in), the profile's pins, and stackfarm itself (its wheel is
   built from this checkout: the host has no stackfarm yet).
2. pip resolves that for the host's Python and platform without installing or downloading the big wheels
   (`pip install --dry-run --ignore-installed --only-binary=:all: --python-version --platform ... --report`,
   PEP 658 metadata), run by an interpreter of the host's X.Y where this machine has one (markers then read as
   they will there).
3. From the requested ones down, the dependency graph is walked: a distribution the host provides at a version
   every carried dependent accepts is not carried (nor what only it needs); a pinned one always is; a
   `leave_out` or `absent` one is not, and each is named with who wanted it.
4. Each carried wheel is fetched by URL and checked by its sha256 through the content-addressed cache
   (stackfarm.artifacts.Cache); a component with `missing` globs is repacked without those files. Its RECORD is
   kept as the wheel's: installed, the tree is the wheel's minus exactly the declared files, which 00-stack
   passes as declared and counts, and every file that is there is still checked against the real wheel's hashes.
5. The wheels the suite families require beyond the stack (stackfarm.handover.required; 20-eagle3's comparison
   wheel, the nearest older SGLang of its `compare_with`, which it unpacks and reads, never
   installs) go into the wheelhouse too: the profile routes them there ([[route]] to a find_links index).
6. OUT holds install.py (stdlib only: stackfarm.wheelhouse_install), manifest.json (the sha256 of every wheel
   and part, what is provided, left out, repacked) and bundle.tar, or bundle.tar.NNN parts of at most --split.
"""

from __future__ import annotations

import email.message
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from . import interpreters
from .artifacts import Artifact, Cache
from .errors import ConfigError, EnvironmentProblem, StackfarmError
from .files import sha256_file
from .handover import required
from .matrix import Deviation, Matrix
from .plan import Cell, Component
from .requires import requires_dist
from .resolve import Resolver

MANIFEST = "manifest.json"
INSTALLER = "install.py"
TARBALL = "bundle.tar"
#: Inside the tar: every wheel, installed or not (the host's find_links index).
WHEELS = "wheelhouse"
_SIZE = re.compile(r"^(\d+)([KMG]i?B?|B)?$", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class Item:
    """One distribution of pip's resolution (its installation report)."""

    name: str
    version: str
    url: str
    sha256: str
    requires: tuple[str, ...]
    extras: tuple[str, ...]
    requested: bool


@dataclass(frozen=True, kw_only=True)
class BundledWheel:
    """A wheel in the bundle, as the manifest lists it."""

    name: str
    version: str
    filename: str
    sha256: str
    size: int
    install: bool
    #: Why it is there: "cell", "suite 40-throughput", "pin", "stackfarm", "dependency of sglang", "compare".
    why: str
    origin: str = ""
    #: The original wheel's sha256 and the files left out, for a component repacked for a deviation.
    repacked_from: str = ""
    omitted: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Selection:
    """What the walk over pip's resolution decided."""

    carried: Mapping[str, str]  # name -> why
    extras: Mapping[str, tuple[str, ...]]
    provided: Mapping[str, str] = field(default_factory=dict)  # name -> what the host has, for whom
    left_out: Mapping[str, str] = field(default_factory=dict)  # name -> reason (and who wanted it)


def parse_size(text: str) -> int:
    """--split SIZE: bytes, or with K/M/G (powers of 1024: 58M = 58 MiB)."""
    found = _SIZE.match(text.strip())
    if not found:
        raise StackfarmError(f"--split {text!r}: not a size like 58M, 512K or 60817408")
    unit = (found.group(2) or "B")[0].upper()
    size = int(found.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]
    if size < 1 << 16:
        raise StackfarmError(f"--split {text!r}: parts under 64 KiB are not useful; e.g. --split 58M")
    return size


def platform_tags(tag: str) -> list[str]:
    """Every platform tag a host of `tag` installs (manylinux_2_39_x86_64: manylinux_2_39 ... 2_5, the legacy
    aliases): pip's --platform matches each exactly."""
    found = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not found:
        return [tag]
    minor, arch = int(found.group(1)), found.group(2)
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{legacy[n]}_{arch}" for n in sorted(legacy, reverse=True) if n <= minor]
    return [*tags, f"linux_{arch}"]


# --------------------------------------------------------------------------- what is asked for


def suite_wheels(matrix: Matrix, cell: Cell) -> list[tuple[str, str]]:
    """(requirement, "suite NN-name") of every enabled suite's `wheels`, {cuda_major} filled in."""
    major = cell.as_dict().get("cuda", "12").split(".")[0]
    return [(w.replace("{cuda_major}", major), f"suite {s.name}") for s in matrix.suites for w in s.wheels]


def _absent(matrix: Matrix) -> dict[str, Deviation]:
    return {canonicalize_name(d.component): d for d in matrix.deviations if d.absent}


def _missing(matrix: Matrix) -> dict[str, Deviation]:
    return {canonicalize_name(d.component): d for d in matrix.deviations if d.missing}


def requested(matrix: Matrix, cell: Cell, own_wheel: Path) -> list[tuple[str, str]]:
    """(requirement, why) of everything the bundle is asked to carry, before resolution: the cell's stack, the
    suites' wheels, the profile's pins and stackfarm's own requirements (its wheel is carried as built)."""
    assert matrix.profile is not None
    # `===`: the cell's very version (`==2.9.1` would also take a 2.9.1+cu130 an index has beside it).
    reqs = [(f"{c.distribution}==={c.version}", "cell") for c in cell.components]
    reqs += suite_wheels(matrix, cell)
    reqs += [(pin, "pin") for pin in matrix.profile.pins]
    with zipfile.ZipFile(own_wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        meta = email.message_from_bytes(zf.read(name))
    machine = _machine(matrix.profile.platform)
    reqs += [
        (str(r), "stackfarm")
        for r in requires_dist(meta, python=matrix.profile.python, platform_machine=machine, extras=())
    ]
    return reqs


def _machine(platform: str) -> str:
    """The platform_machine of a platform tag (manylinux_2_39_x86_64: x86_64)."""
    for machine in ("x86_64", "aarch64", "ppc64le", "s390x", "armv7l", "i686"):
        if platform.endswith(machine):
            return machine
    return platform.rsplit("_", 1)[-1]


def to_resolve(matrix: Matrix, roots: Sequence[tuple[str, str]]) -> list[str]:
    """The requested requirements pip is asked about: not those the host provides a matching version of (unless
    pinned), so nothing of the host's own is looked up on an index."""
    assert matrix.profile is not None
    provides, pinned = (
        matrix.profile.provides,
        {canonicalize_name(Requirement(p).name) for p in matrix.profile.pins},
    )
    absent = _absent(matrix)
    out = []
    for text, _why in roots:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        have = provides.get(name)
        if name in absent:
            continue
        if name in pinned or have is None or not req.specifier.contains(have, prereleases=True):
            out.append(text)
    return out


# --------------------------------------------------------------------------- pip's resolution


def _pip_python(version: str) -> str:
    """A Python of the host's X.Y when this machine has one (markers then read as on the host), else this one."""
    try:
        return interpreters.find(version).path
    except EnvironmentProblem:
        return sys.executable


def resolve(
    matrix: Matrix, reqs: Sequence[str], work: Path, *, log: Callable[[str], None] = print, deps: bool = True
) -> list[Item]:
    """pip's resolution of `reqs` for the profile's host (nothing installed, no big wheel downloaded); `deps`
    False: each requirement alone, without its dependencies (the profile's nodeps)."""
    assert matrix.profile is not None
    profile = matrix.profile
    python = _pip_python(profile.python)
    report = work / ("pip-report.json" if deps else "pip-report-nodeps.json")
    argv = [
        python,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--python-version",
        profile.python,
        "--implementation",
        "cp",
        "--abi",
        "cp" + profile.python.replace(".", ""),
        "--target",
        str(work / "target"),
        "--report",
        str(report),
        "--quiet",
    ]
    for tag in platform_tags(profile.platform):
        argv += ["--platform", tag]
    argv += _index_options(matrix, reqs)
    argv += list(reqs) if deps else ["--no-deps", *reqs]
    log(
        f"resolving {len(reqs)} requirements for Python {profile.python} on {profile.platform} ({python} -m pip)"
    )
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=pip_environment())
    if done.returncode != 0:
        tail = "\n".join(line for line in done.stderr.splitlines() if "is ignored" not in line)[-2500:]
        raise StackfarmError(
            f"pip could not resolve the bundle for {profile.name} (exit {done.returncode}):\n{tail}\n"
            "  fix: see pip's message; a conflict with the host is settled in the profile (pins, leave_out)"
        )
    return parse_report(json.loads(report.read_text(encoding="utf-8")))


def pip_environment() -> dict[str, str]:
    """This environment for pip, without this machine's pip configuration of indexes (config files, PIP_INDEX_URL,
    PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX): the matrix's indexes alone decide. PIP_CERT, proxies stay."""
    dropped = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONFIG_FILE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _routed(matrix: Matrix, reqs: Sequence[str]) -> set[str]:
    """The indexes a [[route]] sends one of `reqs` to (an exact pin matching the route's requirement)."""
    found = set()
    for text in reqs:
        req = Requirement(text)
        pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
        for route in matrix.routes:
            same = canonicalize_name(route.requirement.name) == canonicalize_name(req.name)
            if same and any(route.requirement.specifier.contains(v, prereleases=True) for v in pins):
                found.add(route.index)
    return found


def _index_options(matrix: Matrix, reqs: Sequence[str]) -> list[str]:
    """pip's index options: the matrix's default index, and the others only where a requirement is routed there
    (an extra index pip cannot reach would stall every lookup)."""
    default = matrix.indexes[matrix.default_index]
    routed = _routed(matrix, reqs)
    out: list[str] = []
    if default.url is not None:
        out += ["--index-url", default.url]
    for name, source in matrix.indexes.items():
        if name == matrix.default_index:
            continue
        if source.url is not None and name in routed:
            out += ["--extra-index-url", source.url]
        elif source.find_links is not None:
            out += ["--find-links", str(source.find_links)]
    if default.find_links is not None:
        out += ["--no-index", "--find-links", str(default.find_links)]
    return out


def parse_report(data: Mapping[str, Any]) -> list[Item]:
    """The items of pip's installation report (pip's `--report` format, version 1)."""
    items = []
    for entry in data.get("install", []):
        meta, info = entry["metadata"], entry["download_info"]
        hashes = info.get("archive_info", {}).get("hashes", {})
        sha = hashes.get("sha256") or str(info.get("archive_info", {}).get("hash", "")).removeprefix(
            "sha256="
        )
        items.append(
            Item(
                name=canonicalize_name(meta["name"]),
                version=str(meta["version"]),
                url=str(info["url"]),
                sha256=sha,
                requires=tuple(meta.get("requires_dist") or ()),
                extras=tuple(meta.get("provides_extra") or ()),
                requested=bool(entry.get("requested")),
            )
        )
    return items


# --------------------------------------------------------------------------- what is carried


def _requirements(item: Item, extras: Iterable[str], python: str, machine: str) -> list[Requirement]:
    meta = email.message.Message()
    meta["Name"] = item.name
    for line in item.requires:
        meta["Requires-Dist"] = line
    for extra in item.extras:
        meta["Provides-Extra"] = extra
    return requires_dist(meta, python=python, platform_machine=machine, extras=tuple(extras))


def select(items: Sequence[Item], roots: Sequence[tuple[str, str]], matrix: Matrix) -> Selection:
    """Walk pip's resolution from the requested requirements down: what the bundle carries, and why not the rest."""
    assert matrix.profile is not None
    profile = matrix.profile
    by_name = {i.name: i for i in items}
    pinned = {canonicalize_name(Requirement(p).name) for p in profile.pins}
    as_is = {canonicalize_name(Requirement(p).name) for p in profile.nodeps}
    absent = _absent(matrix)
    machine = _machine(profile.platform)
    carried: dict[str, str] = {}
    extras: dict[str, set[str]] = {}
    provided: dict[str, str] = {}
    left_out: dict[str, str] = {}
    todo: list[tuple[str, Requirement, set[str], str]] = []
    for text, why in roots:
        req = Requirement(text)
        todo.append((canonicalize_name(req.name), req, set(req.extras), why))
    while todo:
        name, req, want, why = todo.pop()
        if name in as_is:  # carried as the profile names it, whatever else asks
            carried.setdefault(name, "nodeps")
            extras.setdefault(name, set())
            continue
        if name in absent:
            left_out[name] = f"absent on the host ([[deviation]]: {absent[name].reason}); wanted by {why}"
            continue
        if name in profile.leave_out and name not in pinned and why != "cell":
            left_out.setdefault(name, f"{profile.leave_out[name]} (wanted by {why})")
            continue
        have = profile.provides.get(name)
        if (
            name not in carried
            and name not in pinned
            and have is not None
            and req.specifier.contains(have, prereleases=True)
        ):
            provided.setdefault(name, f"{name}=={have} on the host (wanted by {why})")
            continue
        if name not in by_name:
            raise StackfarmError(
                f"{name} (wanted by {why}) is not in pip's resolution: a marker pip read otherwise"
            )
        new = want - extras.get(name, set())
        if name in carried and not new:
            continue
        carried.setdefault(name, why)
        extras.setdefault(name, set()).update(want)
        provided.pop(name, None)
        for dep in _requirements(by_name[name], extras[name], profile.python, machine):
            todo.append((canonicalize_name(dep.name), dep, set(dep.extras), f"dependency of {name}"))
    return Selection(
        carried=carried,
        extras={k: tuple(sorted(v)) for k, v in extras.items()},
        provided=provided,
        left_out=left_out,
    )


# --------------------------------------------------------------------------- the files


def glob_re(pattern: str) -> re.Pattern[str]:
    """A path glob as 00-stack reads a deviation's `missing`: ** spans folders, * and ? stay within one."""
    out = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
    return re.compile(out + r"\Z")


def repack(blob: Path, out: Path, missing: Sequence[str]) -> tuple[str, ...]:
    """Copy the wheel `blob` to `out` without the members matching `missing`; RECORD stays the wheel's own, so the
    installed tree lists the left-out files (00-stack excuses exactly those, as declared). The omitted names."""
    patterns = [glob_re(g) for g in missing]
    omitted = []
    with zipfile.ZipFile(blob) as src, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if any(p.match(info.filename) for p in patterns):
                omitted.append(info.filename)
                continue
            with src.open(info) as fh:
                dst.writestr(info, fh.read(), compress_type=info.compress_type)
    if not omitted:
        out.unlink()
        raise ConfigError(
            Path("[[deviation]]"),
            f"{blob.name}: no member matches the deviation's missing globs {list(missing)}",
            fix="correct the globs (paths inside the wheel, ** for any depth) or drop the deviation",
        )
    return tuple(omitted)


def build_own_wheel(work: Path) -> Path:
    """stackfarm's wheel, built from the checkout this stackfarm runs from (`pip wheel --no-deps`)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise EnvironmentProblem(
            f"stackfarm runs from {root}, not from a checkout: its wheel cannot be built for the bundle",
            fix="run `stackfarm bundle` from a checkout of the project (pip install -e .)",
        )
    folder = work / "own"
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--quiet",
        "--wheel-dir",
        str(folder),
        str(root),
    ]
    if importlib.util.find_spec("setuptools") is not None:  # the wheel builds here, no build backend fetched
        argv.insert(4, "--no-build-isolation")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise EnvironmentProblem(
            f"building stackfarm's wheel failed: {done.stderr[-1500:]}", fix="see pip's message"
        )
    (wheel,) = folder.glob("stackfarm-*.whl")
    return wheel


def _artifact(item: Item) -> Artifact:
    filename = unquote(Path(urlparse(item.url).path).name)
    return Artifact(
        distribution=item.name,
        version=item.version,
        filename=filename,
        url=item.url,
        sha256=item.sha256,
        size=None,
        source="pip-resolution",
    )


# --------------------------------------------------------------------------- the bundle


@dataclass
class Bundle:
    """What `build` wrote."""

    out: Path
    wheels: list[BundledWheel]
    parts: list[tuple[str, str, int]]  # (name, sha256, size)
    seconds: float
    selection: Selection

    @property
    def size(self) -> int:
        return sum(w.size for w in self.wheels)


def build(
    matrix: Matrix,
    cell: Cell,
    out: Path,
    *,
    split: int | None,
    cache: Cache,
    log: Callable[[str], None] = print,
) -> Bundle:
    """Write the wheelhouse bundle of `cell` for `matrix.profile`'s host into `out`."""
    if matrix.profile is None:
        raise StackfarmError("a wheelhouse bundle is made for a host: pass --profile runners/<kind>.toml")
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob(f"{TARBALL}*"), out / MANIFEST]:
        stale.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="stackfarm-bundle-") as tmp:
        work = Path(tmp)
        own = build_own_wheel(work)
        roots = requested(matrix, cell, own)
        items = resolve(matrix, to_resolve(matrix, roots), work, log=log)
        if matrix.profile.nodeps:
            alone = resolve(matrix, matrix.profile.nodeps, work, log=log, deps=False)
            items = [*(i for i in items if i.name not in {a.name for a in alone}), *alone]
            roots += [(p, "nodeps") for p in matrix.profile.nodeps]
        chosen = select(items, roots, matrix)
        staging = work / WHEELS
        staging.mkdir()
        wheels = _fetch(items, chosen, matrix, cache, staging, own=own, log=log)
        wheels += _required(matrix, cell, cache, staging, log)
        manifest = _manifest(matrix, cell, wheels, chosen)
        (staging.parent / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        parts = _pack(work, out, split)
    manifest["parts"] = [{"name": n, "sha256": s, "size": z} for n, s, z in parts]
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    shutil.copyfile(Path(__file__).with_name("wheelhouse_install.py"), out / INSTALLER)
    return Bundle(out=out, wheels=wheels, parts=parts, seconds=time.monotonic() - started, selection=chosen)


def _fetch(
    items: Sequence[Item],
    chosen: Selection,
    matrix: Matrix,
    cache: Cache,
    staging: Path,
    *,
    own: Path,
    log: Callable[[str], None],
) -> list[BundledWheel]:
    missing = _missing(matrix)
    target = staging / own.name
    shutil.copyfile(own, target)
    own_item = Item(
        name="stackfarm",
        version=own.name.split("-")[1],
        url="",
        sha256="",
        requires=(),
        extras=(),
        requested=True,
    )
    wheels = [_listed(own_item, target, "stackfarm", origin="built from this checkout")]
    for item in items:
        if item.name not in chosen.carried or item.name == "stackfarm":
            continue
        why = chosen.carried[item.name]
        artifact = _artifact(item)
        log(f"fetch {artifact.filename}")
        blob = cache.fetch(artifact)
        target = staging / artifact.filename
        if item.name in missing:
            omitted = repack(blob, target, missing[item.name].missing)
            log(
                f"repacked {artifact.filename} without {len(omitted)} files ({', '.join(missing[item.name].missing)})"
            )
            wheels.append(
                _listed(item, target, why, origin=item.url, repacked_from=artifact.sha256, omitted=omitted)
            )
        else:
            shutil.copyfile(blob, target)
            wheels.append(_listed(item, target, why, origin=item.url))
    return wheels


def _listed(item: Item, path: Path, why: str, *, install: bool = True, **more: Any) -> BundledWheel:
    return BundledWheel(
        name=item.name,
        version=item.version,
        filename=path.name,
        sha256=sha256_file(path),
        size=path.stat().st_size,
        install=install,
        why=why,
        **more,
    )


def _required(
    matrix: Matrix, cell: Cell, cache: Cache, staging: Path, log: Callable[[str], None]
) -> list[BundledWheel]:
    """The wheels the cell's suite families require beyond its stack (stackfarm.handover.required: 20-eagle3's
    comparison release, the nearest older of its `compare_with`): carried, never installed (a suite unpacks and
    reads them); the profile must route each to the wheelhouse."""
    assert matrix.profile is not None
    resolver = Resolver(matrix, cache)
    stack = {c.distribution: c.version for c in cell.components}
    out: list[BundledWheel] = []
    for suite, component in required(matrix.suites, stack, resolver, matrix.profile.python):
        _check_routed(matrix, suite, component)
        artifact, blob = resolver.fetch(component, matrix.profile.python)
        log(f"fetch {artifact.filename} ({suite} needs it)")
        target = staging / artifact.filename
        shutil.copyfile(blob, target)
        item = Item(
            name=component.distribution,
            version=component.version,
            url=artifact.url,
            sha256=artifact.sha256,
            requires=(),
            extras=(),
            requested=False,
        )
        out.append(_listed(item, target, f"needed by {suite}", install=False, origin=artifact.url))
    return out


def _check_routed(matrix: Matrix, suite: str, component: Component) -> None:
    """The host must find a required wheel in the wheelhouse: a profile [[route]] to a find_links index."""
    assert matrix.profile is not None
    from .profile import read_toml

    raw = read_toml(matrix.profile.path)
    local = {n for n, e in raw.get("indexes", {}).items() if isinstance(e, dict) and "find_links" in e}
    name, version = canonicalize_name(component.distribution), component.version
    for route in raw.get("route", []):
        req = Requirement(str(route.get("requirement", "x")))
        if (
            canonicalize_name(req.name) == name
            and req.specifier.contains(version)
            and route.get("index") in local
        ):
            return
    raise ConfigError(
        matrix.profile.path,
        f"{suite} needs {name} {version} on the host, and the profile routes it to no find_links index",
        fix=f'add [indexes.wheelhouse] find_links = "${{STACKFARM_WHEELHOUSE}}" and [[route]] requirement = '
        f'"{name}=={version}", index = "wheelhouse"',
    )


def _manifest(
    matrix: Matrix, cell: Cell, wheels: Sequence[BundledWheel], chosen: Selection
) -> dict[str, Any]:
    assert matrix.profile is not None
    profile = matrix.profile
    return {
        "format": 1,
        "cell": cell.id,
        "profile": {
            "name": profile.name,
            "sha256": profile.sha256,
            "python": profile.python,
            "platform": profile.platform,
        },
        "matrix": matrix.path.name,
        "deviations": [d.as_dict() for d in matrix.deviations],
        "wheels_folder": WHEELS,
        "wheels": [asdict(w) for w in wheels],
        "provided": dict(sorted(chosen.provided.items())),
        "left_out": dict(sorted(chosen.left_out.items())),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _pack(work: Path, out: Path, split: int | None) -> list[tuple[str, str, int]]:
    """bundle.tar (the wheels and the manifest), whole or in parts of at most `split` bytes."""
    tarball = work / TARBALL
    with tarfile.open(tarball, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(work / MANIFEST, arcname=MANIFEST)
        for path in sorted((work / WHEELS).iterdir()):
            tar.add(path, arcname=f"{WHEELS}/{path.name}")
    if split is None or tarball.stat().st_size <= split:
        shutil.move(str(tarball), out / TARBALL)
        names = [TARBALL]
    else:
        names = []
        with tarball.open("rb") as src:
            while chunk := src.read(split):
                name = f"{TARBALL}.{len(names):03d}"
                (out / name).write_bytes(chunk)
                names.append(name)
    return [(n, sha256_file(out / n), (out / n).stat().st_size) for n in names]


__all__ = [
    "INSTALLER",
    "MANIFEST",
    "TARBALL",
    "WHEELS",
    "Bundle",
    "BundledWheel",
    "Item",
    "Selection",
    "build",
    "glob_re",
    "parse_report",
    "parse_size",
    "platform_tags",
    "repack",
    "requested",
    "resolve",
    "select",
    "suite_wheels",
]
