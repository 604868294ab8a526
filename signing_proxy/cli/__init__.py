"""The ``signing-proxy`` command: ``launch`` (the entry point, light) -> ``main`` (parser, dispatch,
the one-line refusal) -> one module per command group (``run``, ``keys``, ``publish``, ``ca``, ``config``,
``delegate``, ``discover``, ``verify_origin``) -> ``common`` (configuration from flags and
environment, logging, shared flags); never back."""
