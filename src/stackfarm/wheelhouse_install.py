"""Install a stackfarm wheelhouse bundle on a host that reaches no index: the one command, standard library only.

`stackfarm bundle CELL --wheelhouse OUT` copies this file to OUT/install.py beside OUT/manifest.json and the
bundle's parts. On the host (which has no stackfarm yet)::

    python3 OUT/install.py --prefix /tmp/pfx          # checks, joins, installs; prints the environment
    . /tmp/pfx/stackfarm-env.sh                       # PYTHONPATH, PATH, STACKFARM_WHEELHOUSE
    stackfarm run --backend host --python python3 --profile runners/<kind>.toml --cells 'CELL'

It checks every part's sha256 and size against the manifest, joins them, checks every wheel's sha256, then runs
`python -m pip install --no-index --no-deps --no-compile --ignore-installed --prefix PREFIX` on the wheels the
manifest marks for installing: --prefix lays console scripts out as RECORD lists them (--target loses the
``../../bin`` ones), and --ignore-installed leaves the host's own copies alone (without it pip would uninstall
them). All wheels stay in PREFIX/wheelhouse, the host's find_links index (STACKFARM_WHEELHOUSE) for the wheels a
suite fetches. A `.pth` file is read only in site directories, and PREFIX's is not one: the folders the installed
`.pth` files name go onto PYTHONPATH too (nvidia-cutlass-dsl finds its package that way).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

ENV_FILE = "stackfarm-env.sh"
_SITE = "import sysconfig, sys; print(sysconfig.get_path('purelib', vars={'base': sys.argv[1], 'platbase': sys.argv[1]}))"
_HAVE = """
import json, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


class Refused(Exception):
    """The bundle cannot be installed as it is (a part missing or damaged, another Python)."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_parts(manifest: dict[str, Any], where: Path) -> list[Path]:
    """Every part, present with its size and sha256 (the first problem found is refused, naming the part)."""
    paths = []
    for part in manifest["parts"]:
        path = where / part["name"]
        if not path.is_file():
            raise Refused(f"{path}: missing (the bundle has {len(manifest['parts'])} parts); carry it there")
        if path.stat().st_size != part["size"]:
            raise Refused(
                f"{path}: {path.stat().st_size} bytes, the manifest says {part['size']}: cut short?"
            )
        if sha256(path) != part["sha256"]:
            raise Refused(f"{path}: sha256 differs from the manifest's: damaged in transit, carry it again")
        paths.append(path)
    return paths


def join(parts: list[Path], prefix: Path) -> Path:
    """The parts, joined into PREFIX/wheelhouse (the tar's contents), checked."""
    joined = prefix / ".bundle.tar"
    prefix.mkdir(parents=True, exist_ok=True)
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)
    with tarfile.open(joined) as tar:
        for member in tar.getmembers():
            if member.name.startswith(("/", "..")) or ".." in Path(member.name).parts or not member.isfile():
                raise Refused(f"the bundle holds an unexpected member {member.name!r}")
        tar.extractall(prefix)
    joined.unlink()
    return prefix


def check_wheels(manifest: dict[str, Any], folder: Path) -> list[Path]:
    """Every wheel of the manifest in `folder` with its sha256; the ones to install, in manifest order."""
    install = []
    for wheel in manifest["wheels"]:
        path = folder / wheel["filename"]
        if not path.is_file() or sha256(path) != wheel["sha256"]:
            raise Refused(f"{path}: missing or not the manifest's sha256 {wheel['sha256'][:12]}…")
        if wheel["install"]:
            install.append(path)
    return install


def pth_paths(site: Path) -> list[Path]:
    """The folders the `.pth` files in `site` add (their path lines; `import` lines are not run here)."""
    found = []
    for pth in sorted(site.glob("*.pth")):
        for raw in pth.read_text(encoding="utf-8", errors="replace").splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = (site / line).resolve()
            if path.is_dir() and path not in found:
                found.append(path)
    return found


def host_check(manifest: dict[str, Any], python: str) -> list[str]:
    """The distributions the bundle counts on the host for, where the host has another version (or none)."""
    wanted = {}
    for name, text in manifest.get("provided", {}).items():
        version = text.split("==", 1)[1].split(" ", 1)[0] if "==" in text else ""
        wanted[name] = version
    if not wanted:
        return []
    done = subprocess.run([python, "-c", _HAVE, *wanted], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return [f"could not ask {python} what it has: {done.stderr.strip()[-300:]}"]
    have = json.loads(done.stdout.strip().splitlines()[-1])
    return [
        f"{name}: the bundle counts on {version} on the host, it has {have.get(name) or 'none'}"
        for name, version in sorted(wanted.items())
        if have.get(name) != version
    ]


def install(bundle: Path, prefix: Path, python: str, parts_dir: Path | None = None) -> dict[str, str]:
    """Check, join and install the bundle in `bundle` (install.py's folder) into `prefix`; the environment."""
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    want = manifest["profile"]["python"]
    done = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.stdout.strip() != want:
        raise Refused(f"{python} is Python {done.stdout.strip() or '?'}; the bundle was made for {want}")
    parts = check_parts(manifest, parts_dir or bundle)
    prefix = prefix.absolute()
    join(parts, prefix)
    folder = prefix / manifest["wheels_folder"]
    wheels = check_wheels(manifest, folder)
    argv = [
        python,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--ignore-installed",
        "--disable-pip-version-check",
        "--quiet",
        "--prefix",
        str(prefix),
        *map(str, wheels),
    ]
    print(f"installing {len(wheels)} wheels into {prefix}", flush=True)
    if subprocess.run(argv, check=False).returncode != 0:
        raise Refused("pip install failed (its message is above)")
    site = Path(
        subprocess.run(
            [python, "-c", _SITE, str(prefix)], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    path = [site, *pth_paths(site)]
    env = {
        "PYTHONPATH": os.pathsep.join([*map(str, path), "${PYTHONPATH:-}"]),
        "PATH": f"{prefix / 'bin'}{os.pathsep}${{PATH}}",
        "STACKFARM_WHEELHOUSE": str(folder),
    }
    lines = [f'export {k}="{v}"' for k, v in env.items()]
    (prefix / ENV_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    for problem in host_check(manifest, python):
        print(f"warning: {problem}", file=sys.stderr)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prefix", type=Path, required=True, help="where to install (e.g. /tmp/pfx)")
    parser.add_argument(
        "--python", default=sys.executable, help="the host Python to install for (default: this)"
    )
    parser.add_argument(
        "--parts", type=Path, default=None, help="the folder of the parts (default: install.py's)"
    )
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent
    try:
        install(here, args.prefix, args.python, args.parts)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env_file = args.prefix.absolute() / ENV_FILE
    print(f"installed. Use it with:\n  . {shlex.quote(str(env_file))}")
    print(env_file.read_text(encoding="utf-8"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ENV_FILE",
    "Refused",
    "check_parts",
    "check_wheels",
    "host_check",
    "install",
    "join",
    "main",
    "pth_paths",
    "sha256",
]
