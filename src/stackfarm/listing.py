"""A simple index's project page, parsed: PEP 691 JSON or PEP 503 HTML, with PEP 658/714 metadata hashes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urldefrag, urljoin, urlparse


@dataclass(frozen=True)
class File:
    filename: str
    url: str
    sha256: str
    size: int | None
    yanked: bool = False
    path: Path | None = None  # set for local files, whose hash is computed only when chosen
    metadata_sha256: str | None = None  # PEP 658/714: "" when served without a hash, None when not served


def core_metadata(value: object) -> str | None:
    """The metadata hash of a PEP 691 ``core-metadata`` value (a bool or {algorithm: hex}) or of a PEP 658
    ``data-core-metadata`` attribute ("true" or "sha256=<hex>"); "" when served without a sha256."""
    if value is None or value is False or value in ("false",):
        return None
    if isinstance(value, dict):
        return str(value.get("sha256", "")).lower()
    if isinstance(value, str) and value.startswith("sha256="):
        return value.removeprefix("sha256=").lower()
    return ""


class _LinkParser(HTMLParser):
    """Collects ``<a>`` tags of a PEP 503 page as (attributes, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[dict[str, str | None], str]] = []
        self._attrs: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._attrs, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._attrs is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._attrs is not None:
            self.links.append((self._attrs, "".join(self._text).strip()))
            self._attrs = None


def parse_listing(page: str, content_type: str, body: bytes) -> tuple[File, ...]:
    if content_type.endswith("json"):
        files = json.loads(body).get("files", [])
        return tuple(
            File(
                filename=f["filename"],
                url=urljoin(page, f["url"]),
                sha256=str((f.get("hashes") or {}).get("sha256", "")).lower(),
                size=f["size"] if isinstance(f.get("size"), int) else None,
                # PEP 691: yanked is a bool or a non-empty reason string.
                yanked=bool(f.get("yanked", False)),
                # PEP 714 renamed dist-info-metadata to core-metadata; older servers send the old key only.
                metadata_sha256=core_metadata(f.get("core-metadata", f.get("dist-info-metadata"))),
            )
            for f in files
        )
    parser = _LinkParser()
    parser.feed(body.decode("utf-8", "replace"))
    out = []
    for attrs, text in parser.links:
        if not attrs.get("href"):
            continue
        url, fragment = urldefrag(urljoin(page, attrs["href"] or ""))
        sha = fragment.removeprefix("sha256=").lower() if fragment.startswith("sha256=") else ""
        name = text or unquote(PurePosixPath(urlparse(url).path).name)
        keys = [k for k in ("data-core-metadata", "data-dist-info-metadata") if k in attrs]
        meta = (attrs[keys[0]] or "true") if keys else None  # an attribute without a value means "true"
        out.append(
            File(
                filename=name,
                url=url,
                sha256=sha,
                size=None,
                yanked="data-yanked" in attrs,
                metadata_sha256=core_metadata(meta),
            )
        )
    return tuple(out)


__all__ = ["File", "core_metadata", "parse_listing"]
