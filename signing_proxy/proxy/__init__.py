"""Everything that awaits: listeners, handlers, TLS interception, upstream client, relay, caches."""
