"""The world outside the source tree, as `pysource.Evaluator` models it for one GPU and one CUDA version.

Evaluated code reaches it through `External` names: ``torch.cuda.get_device_capability()`` is the target GPU's
``(major, minor)``, ``torch.version.cuda`` the cell's CUDA, ``os.environ`` the deployment's environment, the
platform is CUDA with one GPU; ``functools.lru_cache`` / ``partial`` / ``wraps``, ``pathlib.Path`` and pure
builtins behave as they do at run time on known arguments. Anything else is unknown, or answered by the
caller's `observe` hook (a loader's ``glob.glob(pattern)``).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from pathlib import PurePosixPath

from stackfarm.analysis.arch import Arch
from stackfarm.analysis.pyvalues import (
    UNKNOWN,
    DeviceProperties,
    Environ,
    External,
    Function,
    Identity,
    PathValue,
    known,
)

#: Builtins that are pure on known arguments.
_PURE_BUILTINS: dict[str, Callable[..., object]] = {
    name: getattr(builtins, name)
    for name in (
        "int",
        "str",
        "bool",
        "range",
        "frozenset",
        "dict",
        "reversed",
        "enumerate",
        "zip",
        "tuple",
        "list",
        "len",
        "min",
        "max",
        "any",
        "all",
        "abs",
        "sorted",
        "set",
    )
}
#: What a CUDA build of torch has, for ``hasattr(torch, ...)`` / ``hasattr(torch.version, ...)`` checks.
_TORCH_HAS = {
    "torch": frozenset({"cuda", "version", "ops", "distributed"}),
    "torch.version": frozenset({"cuda", "hip", "git_version", "debug", "__version__"}),
}
#: A rule's answer when the call is not one it models.
_NOT_MINE = object()

Args = tuple[object, ...]
Kwargs = dict[str, object]


class Platform:
    """Attributes and calls of names outside the tree (`External`), for `gpu` and `cuda`."""

    def __init__(
        self, gpu: Arch, cuda: str, environ: Environ, observe: Callable[[str, Args], object] | None
    ) -> None:
        self.gpu = gpu
        self.cuda = cuda
        self.environ = environ
        self.observe = observe

    def attr(self, dotted: str, attr: str) -> object:
        name = f"{dotted}.{attr}"
        if name == "os.environ":
            return self.environ
        if name == "torch.version.cuda":
            return self.cuda
        if name in ("torch.version.hip", "torch.version.xpu"):
            return None
        return External(name)

    def call(self, dotted: str, args: Args, kwargs: Kwargs) -> object:
        """The result of calling `dotted` with these arguments (UNKNOWN where it is not modelled)."""
        tail = dotted.rsplit(".", 1)[-1]
        found = self._device(dotted, tail)
        if found is _NOT_MINE:
            found = self._library(dotted, tail, args, kwargs)
        if found is _NOT_MINE:
            found = self._builtin(dotted, tail, args, kwargs)
        if found is not _NOT_MINE:
            return found
        if self.observe is not None and args and all(known(a) for a in args):
            return self.observe(dotted, args)
        return UNKNOWN

    def _device(self, dotted: str, tail: str) -> object:
        """torch's device queries: the target GPU, CUDA, one device."""
        if (tail == "get_device_capability" and "cuda" in dotted) or dotted.endswith(
            "platform.get_device_capability"
        ):
            return (self.gpu.major, self.gpu.minor)
        if tail == "get_device_properties" and "cuda" in dotted:
            return DeviceProperties(self.gpu.major, self.gpu.minor)
        return _presence(dotted, tail)

    def _library(self, dotted: str, tail: str, args: Args, kwargs: Kwargs) -> object:
        """os.getenv, functools' decorators and partial, pathlib.Path / os.path.dirname on known strings."""
        if dotted == "os.getenv" and args and isinstance(args[0], str):
            return self.environ.get(args[0], args[1] if len(args) > 1 else kwargs.get("default"))
        if dotted.startswith("functools."):
            return _functools(dotted, args, kwargs)
        if dotted in ("pathlib.Path", "os.path.dirname"):
            return _path(tail, args)
        return _NOT_MINE

    def _builtin(self, dotted: str, tail: str, args: Args, kwargs: Kwargs) -> object:
        if not dotted.startswith("builtins."):
            return _NOT_MINE
        if dotted == "builtins.map" and len(args) == 2:
            return self._map(*args)
        found = _modelled_builtin(dotted, args)
        if found is _NOT_MINE and tail in _PURE_BUILTINS:
            return _pure_builtin(tail, args, kwargs)
        return found

    def _map(self, mapper: object, items: object) -> object:
        """``map(builtin, known_items)``: each item through the builtin; any other map is unknown."""
        if (
            isinstance(mapper, External)
            and mapper.dotted.startswith("builtins.")
            and isinstance(items, list | tuple)
        ):
            return [self.call(mapper.dotted, (i,), {}) for i in items]
        return UNKNOWN


def _modelled_builtin(dotted: str, args: Args) -> object:
    """hasattr on torch's modules, str of a path, isinstance (unknown: the evaluator has no types)."""
    if dotted == "builtins.hasattr" and len(args) == 2 and isinstance(args[1], str):
        return _platform_hasattr(args[0], args[1])
    if dotted == "builtins.str" and len(args) == 1 and isinstance(args[0], PathValue):
        return args[0].text
    if dotted == "builtins.isinstance":
        return UNKNOWN
    return _NOT_MINE


def _presence(dotted: str, tail: str) -> object:
    """Which devices there are: CUDA is available and initialised, with one GPU; no other accelerator."""
    if dotted == "torch.cuda.is_available":
        return True
    if dotted == "torch.cuda.is_initialized":
        # code that asks only picks one of two ways to read the same device facts (NVML before torch.cuda
        # initialises, torch after: SGLang 0.5.2x's get_device_sm): the torch one is the modelled one
        return True
    if tail == "is_available" and dotted.split(".")[:1] == ["torch"] and dotted.count(".") == 2:
        return False  # torch.xpu / torch.hpu / torch.npu ...: the platform is CUDA
    if dotted in ("torch.cuda.current_device", "torch.cuda.device_count"):
        # one GPU of the target arch (a node of several identical GPUs decides the same way)
        return 0 if tail == "current_device" else 1
    return _NOT_MINE


def _functools(dotted: str, args: Args, kwargs: Kwargs) -> object:
    """lru_cache / cache / wraps leave the function as it is; partial binds its leading arguments."""
    if dotted in ("functools.lru_cache", "functools.cache", "functools.wraps"):
        if args and isinstance(args[0], Function):
            return args[0]
        return Identity()
    if dotted == "functools.partial" and args and isinstance(args[0], Function):
        fn = args[0]
        return Function(fn.module, fn.node, fn.qualname, (*fn.args, *args[1:]), (*fn.kwargs, *kwargs.items()))
    return _NOT_MINE


def _path(tail: str, args: Args) -> object:
    """``pathlib.Path(text)`` / ``os.path.dirname(text)`` of one known string or path."""
    if len(args) == 1 and isinstance(args[0], str | PathValue):
        text = args[0].text if isinstance(args[0], PathValue) else args[0]
        return PathValue(text) if tail == "Path" else str(PurePosixPath(text).parent)
    return _NOT_MINE


def _pure_builtin(name: str, args: Args, kwargs: Kwargs) -> object:
    if any(a is UNKNOWN for a in args) or kwargs:
        return UNKNOWN
    if any(isinstance(a, list) and UNKNOWN in a for a in args):
        return UNKNOWN
    try:
        return _PURE_BUILTINS[name](*args)
    except Exception:
        return UNKNOWN


def _platform_hasattr(obj: object, name: str) -> object:
    if isinstance(obj, External) and obj.dotted in _TORCH_HAS:
        has = _TORCH_HAS[obj.dotted]
        # torch.version is a plain module with a fixed set of names; torch itself has many more than listed
        return name in has if obj.dotted == "torch.version" or name in has else UNKNOWN
    return UNKNOWN


__all__ = ["Platform"]
