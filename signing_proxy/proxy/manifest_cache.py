"""Discovery's cache of publishers' manifests: bounded in entries and in what they hold.

A refusing origin names the manifest URL, and a stranger's origin can name a new one with each
refusal (any query is allowed on the origin's own manifest path). So the cache keeps only what
discovery reads of a manifest (``ver``, ``role``, ``domain``, ``contact``, ``exchanges``; not
``ext``, unknown members or contributors, which a 64 KiB document can make ~1.4 MB of once parsed),
charges each entry (a manifest at 4x its document, a refusal at 1 KiB, and each its URL), and
keeps of a refusal only its reason and the start of its detail. It drops the oldest
entries past ``MAX_ENTRIES`` or ``MAX_BYTES``. A manifest that would cost more than
``MAX_ENTRY_BYTES`` (a quarter of the cache: ``discovery.max_manifest_bytes`` may be 16 MiB) is
served but not kept, so that one publisher's manifest never flushes every other entry. Keys are
``(egress, url)``: what the agent's origin served is not an answer for a stranger's naming of the
same URL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from ..core.errors import ManifestError
from ..core.manifest import WellKnownManifest
from ..verify.cache import LruCache

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "MAX_ENTRY_BYTES", "CachedManifest", "ManifestCache"]

MAX_ENTRIES = 1024  # our choice
MAX_BYTES = 8 * 1024 * 1024  # our choice, as charged
MAX_ENTRY_BYTES = MAX_BYTES // 4  # our choice: a document of about 512 KiB (the default limit is 64 KiB)
_ERROR_COST = 1024  # and the URL's length, charged with every entry
_DETAIL_CHARS = 512  # a refusal's detail names the URL: kept that long at most
_PARSED_FACTOR = 4  # a kept manifest's cost per byte of its document
_NOTHING: MappingProxyType[str, Any] = MappingProxyType({})

Key = tuple[bool, str]


@dataclass(frozen=True, slots=True)
class CachedManifest:
    """A manifest (slimmed to what discovery reads), or the refusal it earned, until ``expires_at``."""

    manifest: WellKnownManifest | None
    error: ManifestError | None
    expires_at: float


class ManifestCache:
    """Manifests and refusals by ``(egress, url)``, oldest dropped first past either bound (looking
    one up leaves its place alone: the oldest insertion goes first)."""

    def __init__(self) -> None:
        self._entries: LruCache[Key, CachedManifest] = LruCache(MAX_ENTRIES, MAX_BYTES, key_size=_url_length)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """The entries' costs."""
        return self._entries.bytes

    def fresh(self, key: Key, now: float) -> CachedManifest | None:
        entry = self._entries.peek(key)
        return entry if entry is not None and now < entry.expires_at else None

    def keep(
        self, key: Key, manifest: WellKnownManifest, expires_at: float, document_bytes: int
    ) -> WellKnownManifest:
        """Cache what discovery reads of ``manifest``, and return that. One that would cost more than
        ``MAX_ENTRY_BYTES`` is returned but not cached (an older entry of ``key`` goes): evicting
        the others for it, or itself too as a bigger one did, would leave the cache empty."""
        kept = replace(manifest, catalog_contributors=(), ext=_NOTHING, extra=_NOTHING)
        cost = _PARSED_FACTOR * document_bytes
        if cost + _url_length(key) > MAX_ENTRY_BYTES:
            self._entries.pop(key)
            return kept
        self._entries.put(key, CachedManifest(kept, None, expires_at), cost)
        return kept

    def refuse(self, key: Key, error: ManifestError, expires_at: float) -> None:
        """Remember the refusal's reason and detail (cut short), not ``error``: a raised error's
        traceback holds the frames that read the answer (its body, its head, the parsed document),
        up to 2.5 MB each."""
        kept = ManifestError(error.reason, error.detail[:_DETAIL_CHARS])
        self._entries.put(key, CachedManifest(None, kept, expires_at), _ERROR_COST)


def _url_length(key: Key) -> int:
    """What an entry's key costs: the URL a stranger chose."""
    return len(key[1])
