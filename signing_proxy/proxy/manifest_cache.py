"""Discovery's cache of publishers' manifests: bounded in entries and in what they hold.

A refusing origin names the manifest URL, and a stranger's origin can name a new one with each
refusal (any query is allowed on the origin's own manifest path). So the cache keeps only what
discovery reads of a manifest (``ver``, ``role``, ``domain``, ``contact``, ``exchanges``; not
``ext``, unknown members or contributors, which a 64 KiB document can make ~1.4 MB of once parsed),
charges each entry (a manifest at 4x its document, a refusal at 1 KiB), and drops the oldest
entries past ``MAX_ENTRIES`` or ``MAX_BYTES``. Keys are ``(egress, url)``: what the agent's origin
served is not an answer for a stranger's naming of the same URL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from ..core.errors import ManifestError
from ..core.manifest import WellKnownManifest

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "CachedManifest", "ManifestCache"]

MAX_ENTRIES = 1024  # our choice
MAX_BYTES = 8 * 1024 * 1024  # our choice, as charged
_ERROR_COST = 1024
_PARSED_FACTOR = 4  # a kept manifest's cost per byte of its document
_NOTHING: MappingProxyType[str, Any] = MappingProxyType({})

Key = tuple[bool, str]


@dataclass(frozen=True, slots=True)
class CachedManifest:
    """A manifest (slimmed to what discovery reads), or the refusal it earned, until ``expires_at``."""

    manifest: WellKnownManifest | None
    error: ManifestError | None
    expires_at: float
    cost: int


class ManifestCache:
    """Manifests and refusals by ``(egress, url)``, oldest dropped first past either bound."""

    def __init__(self) -> None:
        self._entries: dict[Key, CachedManifest] = {}
        self.bytes = 0  # the entries' costs

    def __len__(self) -> int:
        return len(self._entries)

    def fresh(self, key: Key, now: float) -> CachedManifest | None:
        entry = self._entries.get(key)
        return entry if entry is not None and now < entry.expires_at else None

    def keep(
        self, key: Key, manifest: WellKnownManifest, expires_at: float, document_bytes: int
    ) -> WellKnownManifest:
        """Cache what discovery reads of ``manifest``, and return that."""
        kept = replace(manifest, catalog_contributors=(), ext=_NOTHING, extra=_NOTHING)
        self._store(key, CachedManifest(kept, None, expires_at, _PARSED_FACTOR * document_bytes))
        return kept

    def refuse(self, key: Key, error: ManifestError, expires_at: float) -> None:
        self._store(key, CachedManifest(None, error, expires_at, _ERROR_COST))

    def _store(self, key: Key, entry: CachedManifest) -> None:
        entries = self._entries
        old = entries.pop(key, None)
        self.bytes -= old.cost if old is not None else 0
        while entries and (len(entries) >= MAX_ENTRIES or self.bytes + entry.cost > MAX_BYTES):
            self.bytes -= entries.pop(next(iter(entries))).cost  # the oldest insertion
        if entry.cost <= MAX_BYTES:
            entries[key] = entry
            self.bytes += entry.cost
