"""stackfarm.backends.BACKENDS: each backend declared once, before its module is imported, with what the harness
may do with it; a new backend is one entry and its module (`make(cache, options)`), with no edit elsewhere."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from stackfarm import backends
from stackfarm.artifacts import Cache
from stackfarm.backends import BACKENDS, NAMES, BackendKind, get_backend


def test_every_backend_is_declared_once_and_its_class_carries_the_entry(tmp_path: Path) -> None:
    assert NAMES == ("local", "host", "docker")
    for name, kind in BACKENDS.items():
        module = importlib.import_module(kind.module, backends.__name__)
        assert callable(module.make), name
    assert get_backend("local", Cache(tmp_path)).kind is BACKENDS["local"]
    assert get_backend("host", Cache(tmp_path), python=sys.executable).kind is BACKENDS["host"]


def test_what_each_backend_may_do() -> None:
    """The host backend tests an installation as it is: nothing resolved, patched, reused or planned; the
    wheel-made backends do all four; only docker needs an engine."""
    local, host, docker = (BACKENDS[n] for n in ("local", "host", "docker"))
    for kind in (local, docker):
        assert (kind.resolves, kind.reusable, kind.patchable, kind.planned) == (True, True, True, True)
    assert (host.resolves, host.reusable, host.patchable, host.planned) == (False, False, False, False)
    assert [k.name for k in BACKENDS.values() if k.needs_engine] == ["docker"]


def test_a_new_backend_is_one_entry_and_its_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "toybackend.py").write_text(
        textwrap.dedent(
            """
            from stackfarm.backends import BACKENDS

            class ToyBackend:
                name = "toy"
                kind = BACKENDS["toy"]

                def __init__(self, cache, options):
                    self.cache, self.options = cache, options

            def make(cache, options):
                return ToyBackend(cache, options)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = BackendKind(
        name="toy", module="toybackend", resolves=True, reusable=False, patchable=False, planned=True
    )
    monkeypatch.setitem(BACKENDS, "toy", toy)
    made = get_backend("toy", Cache(tmp_path), index_url="https://example.org/simple")
    assert (made.name, made.kind) == ("toy", toy)
    assert made.options.index_url == "https://example.org/simple"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown backend 'nope'; use one of local, host, docker"):
        get_backend("nope", Cache(tmp_path))
