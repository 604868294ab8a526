"""The only layer that sees everything: it assembles the proxy from its configuration (``app``),
runs its lifecycle (start, reload, drain, stop), its key services and publication listener, the
admin listener and ``--workers`` processes.
"""
