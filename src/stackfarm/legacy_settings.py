"""STILL TO MIGRATE: the settings schemas of the suites that have no ``family.py`` yet (issue 26).

A suite with a family declares its ``[suites.<NN-name>.settings]`` schema in its own folder
(suites/NN-name/family.py, stackfarm.family); 10-capability and 15-toolchain do. The suites below still have
their settings checked here, by the tables they read out of ``cell.settings``, until each gets its family.py:

- 20-eagle3 (suites/20-eagle3/test_eagle3.py): `extra_targets`, `extra_drafts`, `compare_with`,
  `runtime_pairs`, `runtime_timeout`, `attention_backend`.

(30-numerics and 40-throughput declare theirs in their family.py, from stackfarm.numerics.settings and
stackfarm.throughput.settings.)

`SCHEMAS` maps a legacy suite's name to its schema. A suite with neither a family nor an entry here (00-stack,
05-import) accepts no settings: any key in its settings table is an error, like an unknown key.
"""

from __future__ import annotations

from collections.abc import Mapping

from .schema import List, Number, Str, Table
from .settings_kit import CLASS, classes, version

#: [suites.20-eagle3.settings]
EAGLE3 = Table(
    {
        "extra_targets": classes("target classes checked statically besides [[models]]"),
        "extra_drafts": classes("draft classes checked statically besides [[models]]"),
        "compare_with": List(
            Str('a quoted SGLang version, e.g. "0.5.9"', check=version),
            'SGLang versions to diff the contract against (the nearest older one is used), e.g. ["0.5.9"]',
        ),
        "runtime_pairs": List(
            List(Str("a Python class name", pattern=CLASS), "[target, draft]", min_len=2, max_len=2),
            'pairs built on a GPU, e.g. [["LlamaForCausalLM", "LlamaForCausalLMEagle3"]]',
        ),
        "runtime_timeout": Number("seconds per runtime pair: a number > 0, e.g. 900", positive=True),
        "attention_backend": Str('SGLang\'s --attention-backend for the runtime build, e.g. "triton"'),
    },
    noun="setting",
)

#: Legacy suite name -> the schema of its settings table (the suites without family.py).
SCHEMAS: Mapping[str, Table] = {
    "20-eagle3": EAGLE3,
}

#: Accepts no key: the settings of a suite that declares none.
NONE = Table(
    {},
    "remove it: this suite reads no settings (its family.py, or stackfarm.legacy_settings, declares each suite's)",
    noun="setting: this suite declares none",
)


def schema_for(suite: str) -> Table:
    """The legacy schema of `suite`'s settings (`NONE` for a suite that declares none)."""
    return SCHEMAS.get(suite, NONE)


__all__ = ["EAGLE3", "NONE", "SCHEMAS", "schema_for"]
