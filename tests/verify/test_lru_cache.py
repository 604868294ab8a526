"""verify.cache.LruCache: a key's own cost (``key_size``) counts in every insertion and resize."""

from __future__ import annotations

from signing_proxy.verify.cache import LruCache


def test_key_size_is_charged_on_put_and_resize_and_given_back_on_pop() -> None:
    cache: LruCache[str, int] = LruCache(10, 100, key_size=len)
    cache.put("abcd", 1, 10)
    assert cache.bytes == 14
    cache.resize("abcd", 20)
    assert cache.bytes == 24
    cache.put("abcd", 2, 0)  # replaced: the old size goes, the key is charged again
    assert cache.bytes == 4
    cache.pop("abcd")
    assert cache.bytes == 0


def test_long_keys_reach_the_byte_bound_before_the_count() -> None:
    cache: LruCache[str, None] = LruCache(10, 100, key_size=len)
    for n in range(10):
        cache.put(f"{n}" * 30, None)
    assert len(cache) == 3  # 30 bytes each: the oldest went
    assert cache.bytes == 90
