"""``python -m signing_proxy`` is the ``signing-proxy`` command."""

from .cli import main

raise SystemExit(main())
