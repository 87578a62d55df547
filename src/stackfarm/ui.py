"""Progress per cell: a live rich table on a terminal, one line per change elsewhere (CI logs), never wrapped."""

from __future__ import annotations

import re
import sys
import threading
import time
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

_ICONS = {
    "passed": "✅",
    "failed": "❌",
    "incomplete": "⏭",
    "error": "💥",
    "conflict": "⚠️",
    "reused": "♻️",
    "excluded": "⏭",
}


class CellProgress:
    def __init__(self, console: Console | None = None, *, live: bool | None = None) -> None:
        # soft_wrap: a line is never cut at the console's width (80 columns in a pipe): `grep <cell id>` in a
        # CI log finds every line of the cell whole.
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self._live_wanted = self.console.is_terminal if live is None else live
        self._state: dict[str, str] = {}
        self._last_line: dict[str, str] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._started = time.monotonic()

    def __enter__(self) -> CellProgress:
        if self._live_wanted:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def note(self, text: str) -> None:
        """A one-off line above the progress (warnings, notices)."""
        self.console.print(escape(text))

    def update(self, cell: str, text: str) -> None:
        with self._lock:
            self._state[cell] = text
            if self._live is not None:
                self._live.update(self._table())
                return
            # Without a terminal (a CI log), a line per stage change: each suite, each download at 25 % steps.
            stage = stage_of(text)
            if self._last_line.get(cell) != stage:
                self._last_line[cell] = stage
                self.console.print(f"  {escape(cell)}: {escape(text)}")

    def done(self, cell: str, verdict: str, detail: str = "") -> None:
        icon = _ICONS.get(verdict, "•")
        with self._lock:
            self._state.pop(cell, None)
            line = f"{icon} {escape(cell)}: {escape(verdict)}" + (f" — {escape(detail)}" if detail else "")
            if self._live is not None:
                self._live.console.print(line)
                self._live.update(self._table())
            else:
                self.console.print(line)

    def _table(self) -> Table:
        table = Table.grid(padding=(0, 2))
        elapsed = time.monotonic() - self._started
        for cell, text in sorted(self._state.items()):
            table.add_row(f"[bold]{escape(cell)}[/]", escape(text))
        table.add_row(f"[dim]{len(self._state)} running, {elapsed:.0f}s[/]", "")
        return table


_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")


def stage_of(text: str) -> str:
    """What a progress text says, with percentages rounded down to 25 % steps ("fetch torch 37%" ->
    "fetch torch 25%"): a CI log gets a line when this changes, not on every percent."""
    return _PERCENT.sub(lambda m: f"{int(float(m.group(1))) // 25 * 25}%", text)


def plain_console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


__all__ = ["CellProgress", "plain_console", "stage_of"]
