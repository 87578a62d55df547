"""stackfarm.analysis.abicheck's driver-API symbols of the libraries an import loads (`loaded_at_import`,
`import_driver_symbols`), on shared objects compiled here (tests/fakestack.native_kernel_files)."""

from __future__ import annotations

from pathlib import Path

from fakestack import AT_IMPORT_SYMBOL, LAZY_SYMBOL, native_kernel_files
from stackfarm.analysis.abicheck import import_driver_symbols, loaded_at_import, native_libraries
from stackfarm.analysis.cache import JsonCache
from stackfarm.cellspec import InstalledComponent
from stackfarm.driver import symbol_floor


def _component(tmp_path: Path) -> InstalledComponent:
    root = tmp_path / "tree"
    for rel, data in native_kernel_files(tmp_path / "build").items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data if isinstance(data, bytes) else data.encode())
    return InstalledComponent(axis="sgl_kernel", distribution="sgl-kernel", version="0.3.21", filename="",
                              sha256="", source="test", root=str(root))  # fmt: skip


def test_only_the_libraries_an_import_loads_count(tmp_path: Path) -> None:
    comp = _component(tmp_path)
    cache = JsonCache(tmp_path / "cache", "test")
    libs = native_libraries(comp, cache=cache)
    assert sorted(lib.relpath for lib in libs) == [
        "sgl_kernel/lazy.so",
        "sgl_kernel/libkern.so",
        "sgl_kernel/ops.so",
    ]
    assert sorted(lib.relpath for lib in loaded_at_import(libs)) == [
        "sgl_kernel/libkern.so",
        "sgl_kernel/ops.so",
    ]
    at_import = import_driver_symbols([comp], cache)
    assert at_import == {"sgl-kernel/sgl_kernel/libkern.so": (AT_IMPORT_SYMBOL,)}
    floor = symbol_floor(s for names in at_import.values() for s in names)
    assert floor is not None
    assert floor.driver == "555.42.02"
    # A suite that dlopens every library (05-import's GPU part) counts the lazy one too: CUDA 13.0's floor.
    every = import_driver_symbols([comp], cache, every=True)
    assert every["sgl-kernel/sgl_kernel/lazy.so"] == (LAZY_SYMBOL,)
    assert symbol_floor(s for names in every.values() for s in names).driver == "580.65.06"  # type: ignore[union-attr]


def test_a_package_without_an_extension_loads_nothing_at_import(tmp_path: Path) -> None:
    comp = _component(tmp_path)
    (Path(comp.root) / "sgl_kernel" / "ops.so").unlink()
    assert import_driver_symbols([comp], JsonCache(tmp_path / "cache", "test")) == {}
