"""Synchronous on-disk state: owner-only files and locks (``files``), our key store and key files,
and the interception CA. Blocking by nature: the layers above call it at start-up, from commands,
or from a worker thread, never from a request on the event loop.
"""
