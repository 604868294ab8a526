"""One key per transaction (spec "Bound retrieval URLs" 4): which key signs a retrieval fetch.

When the proxy forwards an ExecuteTransaction call it signed, the handler taps the response (a
bounded copy of the body, ``net.forward.BodyTap``) and hands it here once complete: the retrieval
URLs it binds to ``agent_id`` (``core.retrieval``) are remembered with that key. A later request for
such a URL is signed with that key and presents it (``Signature-Key``), whatever key signs other
requests by then; when that key may no longer sign, the request is refused (503
``transaction-key-unavailable``, naming the key), never signed with another.

Only URLs bound to the key that signed the ExecuteTransaction call are remembered (the spec's
binding; a URL bound to another key could only be refused later); at most ``MAX_ENTRIES`` in an LRU
also bounded in bytes, each until its ``expires_at`` (``DEFAULT_TTL_S`` without one), never longer
than ``MAX_TTL_S``. A URL that is not remembered (another worker process forwarded its transaction,
the proxy restarted, the entry was evicted) but whose ``agent_id`` names a key of ours that may sign
now is signed with that key the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

from ..core.errors import ProtocolError
from ..core.keys import KeyProvider
from ..core.requester import EXCHANGE_SERVICE
from ..core.retrieval import agent_id_of, parse_transaction_response
from ..core.uri import Target
from ..errors import ProxyError
from ..net.forward import BodyTap
from ..verify.cache import LruCache

__all__ = [
    "DEFAULT_TTL_S",
    "MAX_ENTRIES",
    "MAX_RESPONSE_BYTES",
    "MAX_TTL_S",
    "TransactionKeys",
]

log = logging.getLogger("signing_proxy.transactions")

EXECUTE_TRANSACTION: Final = f"/{EXCHANGE_SERVICE}/ExecuteTransaction"  # spec "Endpoints"
MAX_RESPONSE_BYTES: Final = (
    1024 * 1024
)  # our choice: an ExecuteTransaction answer read at most (the rest streams)
MAX_ENTRIES: Final = 4096  # our choice: retrieval URLs remembered
MAX_BYTES: Final = 4 * 1024 * 1024  # our choice: their URLs' bytes (a URL is at most 4 KiB)
DEFAULT_TTL_S: Final = 3600.0  # our choice: a bound URL without expires_at is remembered an hour
MAX_TTL_S: Final = 86_400.0  # our choice: never longer than a day, whatever expires_at says
_ENTRY_OVERHEAD: Final = 128  # bytes counted per entry beside its URL


@dataclass(frozen=True, slots=True)
class _Entry:
    agent_id: str
    expires_at: float


class TransactionKeys:
    """Retrieval URLs bound by forwarded ExecuteTransaction responses, and the key each must use."""

    def __init__(
        self,
        keys: KeyProvider,
        *,
        clock: Callable[[], float] = time.time,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.keys = keys
        self.clock = clock
        self._urls: LruCache[str, _Entry] = LruCache(max_entries, max_bytes, key_size=len)

    def __len__(self) -> int:
        return len(self._urls)

    # --- reading ExecuteTransaction responses ---
    def tap_for(self, method: str, target: Target, keyid: str | None) -> BodyTap | None:
        """A tap for the response when this is an ExecuteTransaction call we signed, else None; it
        calls ``observe`` once the response is complete."""
        if keyid is None or method != "POST" or not target.path.endswith(EXECUTE_TRANSACTION):
            return None
        return BodyTap(MAX_RESPONSE_BYTES, on_complete=partial(self._observed, keyid=keyid))

    def _observed(self, tap: BodyTap, *, keyid: str) -> None:
        try:
            self.observe(tap, keyid)
        except Exception:  # a bug must not break the response streaming to the agent
            log.exception("reading an ExecuteTransaction response failed")

    def observe(self, tap: BodyTap, keyid: str) -> int:
        """Remember the URLs a complete, tapped ExecuteTransaction response binds to ``keyid`` (the
        key that signed the call); return how many."""
        head, body = tap.head, tap.body()
        if head is None or not 200 <= head.status < 300 or body is None:
            return 0
        encoding = b", ".join(v for n, v in head.headers if n.lower() == b"content-encoding").strip()
        if encoding not in (b"", b"identity"):  # not decoded here: its URLs stay unbound by us
            log.info("ExecuteTransaction response not read: Content-Encoding %r", encoding[:32])
            return 0
        try:
            result = parse_transaction_response(body)
        except ProtocolError as exc:
            log.info("ExecuteTransaction response not read: %s", exc.detail)
            return 0
        if result.agent_identity_hash not in (None, keyid):
            log.warning(
                "ExecuteTransaction signed by key %s came back with agent_identity_hash %s",
                keyid,
                result.agent_identity_hash,
            )
        now = self.clock()
        remembered = 0
        for binding in result.bindings:
            if binding.agent_id != keyid:
                log.warning(
                    "a retrieval URL is bound to key %s, not to %s that signed its ExecuteTransaction; "
                    "not remembered",
                    binding.agent_id,
                    keyid,
                )
                continue
            until = now + DEFAULT_TTL_S if binding.expires_at is None else float(binding.expires_at)
            until = min(until, now + MAX_TTL_S)
            if until <= now:
                continue
            self._urls.put(binding.url, _Entry(binding.agent_id, until), _ENTRY_OVERHEAD)
            remembered += 1
        return remembered

    # --- signing retrieval fetches ---
    def bound_key(self, target: Target) -> str | None:
        """The thumbprint of the key a request for ``target`` must be signed with, or None (any key)."""
        if "?" not in target.path_query:
            return None
        now = self.clock()
        entry = self._urls.get(target.uri)
        if entry is not None:
            if now < entry.expires_at:
                return entry.agent_id
            self._urls.pop(target.uri)
        agent_id = agent_id_of(target.path_query)
        if agent_id is not None and self.keys.key_for(agent_id, now) is not None:
            return agent_id
        return None

    @staticmethod
    def refusal(agent_id: str) -> ProxyError:
        """The answer when the transaction's key may no longer sign (the fetch is never re-keyed)."""
        return ProxyError(
            503,
            "transaction-key-unavailable",
            f"this retrieval URL is bound to key {agent_id}, which signed its ExecuteTransaction and may "
            "no longer sign (its window ended, or it was revoked); the delivery endpoint accepts no other "
            "key: run the transaction again",
        )
