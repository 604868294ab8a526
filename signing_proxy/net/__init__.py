"""The asyncio HTTP/1.1 engine, knowing nothing of signing, keys or the app.

``server`` parses client connections (llhttp) and hands each request to a ``Handler``; ``forward``
sends a prepared request upstream and streams the answer back; ``upstream`` pools keep-alive
connections; ``client`` is the package's one HTTP client for requests of its own (directories,
revocation lists, manifests); ``framing`` builds every head; ``tls``, ``leaves`` and ``tunnel``
carry CONNECT. Policy lives above, in ``proxy``.
"""
