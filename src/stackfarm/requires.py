"""Which of a wheel's ``Requires-Dist`` entries apply to a cell: CPython on Linux, with the extras the farm installs."""

from __future__ import annotations

import email.message
from collections.abc import Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from stackfarm.errors import ArtifactError

#: The extras a cell installs a distribution with, where its wheel declares them (Provides-Extra): SGLang up to
#: 0.5.2 keeps its torch / sgl-kernel / flashinfer pins under ``extra == "srt"`` (``pip install "sglang[srt]"``),
#: and the farm installs exactly that stack beside it.
INSTALLED_EXTRAS: dict[str, tuple[str, ...]] = {"sglang": ("srt",)}


def requires_dist(
    metadata: email.message.Message,
    *,
    python: str,
    platform_machine: str = "x86_64",
    extras: Iterable[str] | None = None,
) -> list[Requirement]:
    """The ``Requires-Dist`` entries that apply to CPython ``python`` on Linux with ``extras`` installed.

    `extras` None means the ones the farm installs (`INSTALLED_EXTRAS`), those the wheel declares. An extra that
    requires the distribution itself with more extras (``sglang[runtime_common]; extra == "srt"``) turns those
    on too; that self-requirement is not returned.
    """
    release = Version(python).release
    env = {
        "python_version": ".".join(map(str, release[:2])),
        "python_full_version": ".".join(map(str, (*release, 0, 0)[:3])),
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": platform_machine,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }
    name = canonicalize_name(str(metadata.get("Name") or ""))
    declared = {canonicalize_name(str(e)) for e in metadata.get_all("Provides-Extra") or []}
    wanted = INSTALLED_EXTRAS.get(name, ()) if extras is None else tuple(extras)
    active = {canonicalize_name(e) for e in wanted if extras is not None or canonicalize_name(e) in declared}
    parsed = []
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            parsed.append(Requirement(str(line)))
        except InvalidRequirement as exc:
            raise ArtifactError(f"{metadata.get('Name')}: bad Requires-Dist {line!r}: {exc}") from exc

    def applies(req: Requirement) -> bool:
        if req.marker is None:
            return True
        return any(req.marker.evaluate({**env, "extra": extra}) for extra in ("", *sorted(active)))

    while True:  # self-requirements with extras switch further extras on, to a fixed point
        more = {
            canonicalize_name(e)
            for req in parsed
            if canonicalize_name(req.name) == name and applies(req)
            for e in req.extras
        } - active
        if not more:
            break
        active |= more
    return [r for r in parsed if applies(r) and not (canonicalize_name(r.name) == name and name)]


__all__ = ["INSTALLED_EXTRAS", "requires_dist"]
