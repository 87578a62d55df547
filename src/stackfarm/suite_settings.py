"""Which settings each suite accepts: ``[suites.<NN-name>.settings]`` declared per suite, checked by matrix.load.

A suite's library declares its schema next to the code that owns the meaning (`stackfarm.numerics.settings`,
`stackfarm.throughput.settings`); the suites whose code lives only under suites/ are declared here, from what
they read out of ``cell.settings``:

- 10-capability (suites/10-capability/capability_findings.py): `environ`, `table_packages`, `flag_packages`;
- 20-eagle3 (suites/20-eagle3/test_eagle3.py): `extra_targets`, `extra_drafts`, `compare_with`,
  `runtime_pairs`, `runtime_timeout`, `attention_backend`;
- 15-toolchain (suites/15-toolchain, its analysis in analysis/jitfindings.py): `environ` (as 10-capability's), `flashinfer_modes`,
  `selectors`, `families` (stackfarm.analysis.backendsel).

`SCHEMAS` maps a suite's name to its schema. A suite without one (00-stack) accepts no settings: any key in its
settings table is an error, like an unknown key in a suite that has one.
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.version import InvalidVersion, Version

from .numerics.settings import SCHEMA as NUMERICS
from .numerics.settings import SUITE as NUMERICS_SUITE
from .schema import Bool, Either, Enum, List, Map, Number, Str, Table
from .throughput.settings import SCHEMA as THROUGHPUT
from .throughput.settings import SUITE as THROUGHPUT_SUITE

#: How 15-toolchain may ask flashinfer for its kernels: JIT at first use, and the AOT build (analysis/jitfindings.py).
TOOLCHAIN_MODES = ("jit", "aot")

_CLASS = r"[A-Za-z_][A-Za-z0-9_]*"
_PACKAGE = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_GATE = r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*"
_LIB_GATE = r"lib:[A-Za-z0-9][A-Za-z0-9._|-]*:[A-Za-z0-9_./*?\[\]-]+"
_CXX_GATE = r"[A-Za-z0-9][A-Za-z0-9._-]*:[A-Za-z0-9_./-]+\.(?:h|cuh|hpp|cu):[A-Za-z_][A-Za-z0-9_]*"


def _version(text: str) -> str | None:
    try:
        Version(text)
    except InvalidVersion:
        return f"{text!r} is not a PEP 440 version"
    return None


def _classes(what: str) -> List:
    return List(Str("a Python class name", pattern=_CLASS), f'{what}, e.g. ["LlamaForCausalLM"]', unique=True)


#: [suites.20-eagle3.settings]
EAGLE3 = Table(
    {
        "extra_targets": _classes("target classes checked statically besides [[models]]"),
        "extra_drafts": _classes("draft classes checked statically besides [[models]]"),
        "compare_with": List(
            Str('a quoted SGLang version, e.g. "0.5.9"', check=_version),
            'SGLang versions to diff the contract against (the nearest older one is used), e.g. ["0.5.9"]',
        ),
        "runtime_pairs": List(
            List(Str("a Python class name", pattern=_CLASS), "[target, draft]", min_len=2, max_len=2),
            'pairs built on a GPU, e.g. [["LlamaForCausalLM", "LlamaForCausalLMEagle3"]]',
        ),
        "runtime_timeout": Number("seconds per runtime pair: a number > 0, e.g. 900", positive=True),
        "attention_backend": Str('SGLang\'s --attention-backend for the runtime build, e.g. "triton"'),
    },
    noun="setting",
)

_PACKAGES = List(Str("a package name", pattern=_PACKAGE), 'the packages scanned, e.g. ["sglang"]', min_len=1)

#: [suites.10-capability.settings]
CAPABILITY = Table(
    {
        "environ": Map(
            Either(
                (Str("a value", nonempty=False), Number("a number")), 'a string: environ = { NAME = "value" }'
            ),
            'the deployment\'s environment for the gate evaluation: environ = { NAME = "value" }',
            keys=lambda key: None if key and key.replace("_", "a").isalnum() else "is not a variable name",
            noun="variable",
        ),
        "table_packages": _PACKAGES,
        "flag_packages": _PACKAGES,
    },
    noun="setting",
)

#: [suites.15-toolchain.settings]
TOOLCHAIN = Table(
    {
        "environ": CAPABILITY.fields["environ"],
        "flashinfer_modes": List(
            Enum(TOOLCHAIN_MODES, noun="mode"),
            'which of flashinfer\'s arch lists to compile, e.g. ["jit"] or ["jit", "aot"]',
            min_len=1,
            unique=True,
        ),
        "compile": Bool(
            "true: compile flashinfer's rope JIT module with the cell's CUDA toolkit per target arch"
        ),
        "families": _classes(
            "model families (hf_config.architectures) selection is checked for besides [[models]]"
        ),
        "platform": Table(
            {
                "attribute": Str(
                    'the run-time global, e.g. "sglang.srt.platforms:current_platform"', pattern=_GATE
                ),
                "cuda": Str(
                    'its class on a CUDA GPU, e.g. "sglang.srt.platforms.cuda:CudaSRTPlatform"', pattern=_GATE
                ),
                "plugins": Str(
                    'the entry-point group of out-of-tree platforms, e.g. "sglang.srt.platforms"',
                    pattern=r"[A-Za-z_][A-Za-z0-9_.]*",
                ),
            },
            'a table: { attribute = "m:name", cuda = "m:Class", plugins = "group" }',
            required=("attribute", "cuda", "plugins"),
            noun="key",
        ),
        "selectors": Map(
            Table(
                {
                    "selector": Either(
                        (
                            Str('a function "module:qualname"', pattern=_GATE),
                            List(Str('a function "module:qualname"', pattern=_GATE), "", min_len=1),
                        ),
                        'a function "module:qualname" that chooses a backend, or a list of them run in order',
                    ),
                    "sets": List(
                        Str("a setting name", pattern=_CLASS),
                        'settings whose literal assignments are choices, e.g. ["attention_backend"]',
                        unique=True,
                    ),
                    "calls": Map(
                        Str(
                            'a dotted kernel entry, e.g. "flashinfer.prefill.trtllm_ragged_attention_deepseek"',
                            pattern=r"[A-Za-z_][A-Za-z0-9_.]*",
                        ),
                        'backend name -> the kernel entry whose call chooses it: calls = { trtllm = "m.f" }',
                        noun="backend",
                    ),
                    "bind": Map(
                        Str(
                            '"arch.major", "arch.minor" or "self.<attr>"',
                            pattern=r"arch\.(major|minor)|self\.\w+",
                        ),
                        'parameter -> its value: bind = { major = "arch.major" }',
                        noun="parameter",
                    ),
                    "init": Bool("true: run the class's __init__ first (its arch-derived attributes)"),
                    "per_family": Bool("true: run once per model family (it reads hf_config.architectures)"),
                    "admits": Map(
                        Str(
                            'the backend\'s gate: "module:qualname", a C++ arch check '
                            '"<distribution>:<path>.cuh:<symbol>" or its kernels "lib:<distribution>:<glob>"',
                            pattern=_GATE + "|" + _CXX_GATE + "|" + _LIB_GATE,
                        ),
                        'backend name -> the gate deciding whether it runs on a GPU: admits = { fa3 = "m:f" }',
                        noun="backend",
                    ),
                },
                'a table: { selector = "module:qualname", admits = { <backend> = "module:qualname" } }',
                required=("selector",),
                noun="key",
            ),
            "[suites.15-toolchain.settings.selectors.<name>] tables",
            noun="selector",
        ),
    },
    noun="setting",
)

#: Suite name -> the schema of its settings table.
SCHEMAS: Mapping[str, Table] = {
    "10-capability": CAPABILITY,
    "15-toolchain": TOOLCHAIN,
    "20-eagle3": EAGLE3,
    NUMERICS_SUITE: NUMERICS,
    THROUGHPUT_SUITE: THROUGHPUT,
}

#: Accepts no key: the settings of a suite that declares none.
NONE = Table(
    {},
    "remove it: this suite reads no settings (stackfarm.suite_settings lists each suite's)",
    noun="setting: this suite declares none",
)


def schema_for(suite: str) -> Table:
    """The schema of `suite`'s settings (`NONE` for a suite that declares none)."""
    return SCHEMAS.get(suite, NONE)


__all__ = ["CAPABILITY", "EAGLE3", "NONE", "SCHEMAS", "schema_for"]
