"""STILL TO MIGRATE: the settings schemas of the suites that have no ``family.py`` yet (issue 26).

A suite with a family declares its ``[suites.<NN-name>.settings]`` schema in its own folder
(suites/NN-name/family.py, stackfarm.family); 10-capability, 15-toolchain and 20-eagle3 do. The suites below
still have their settings checked here, by the tables they read out of ``cell.settings``, until each gets its
family.py:

- 30-numerics (`stackfarm.numerics.settings`) and 40-throughput (`stackfarm.throughput.settings`): declared next
  to the code that owns the meaning, imported from here until their family.py imports them instead.

`SCHEMAS` maps a legacy suite's name to its schema. A suite with neither a family nor an entry here (00-stack,
05-import) accepts no settings: any key in its settings table is an error, like an unknown key.
"""

from __future__ import annotations

from collections.abc import Mapping

from .numerics.settings import SCHEMA as NUMERICS
from .numerics.settings import SUITE as NUMERICS_SUITE
from .schema import Table
from .throughput.settings import SCHEMA as THROUGHPUT
from .throughput.settings import SUITE as THROUGHPUT_SUITE

#: Legacy suite name -> the schema of its settings table (the suites without family.py).
SCHEMAS: Mapping[str, Table] = {
    NUMERICS_SUITE: NUMERICS,
    THROUGHPUT_SUITE: THROUGHPUT,
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


__all__ = ["NONE", "SCHEMAS", "schema_for"]
