"""``python -m signing_proxy`` is the ``signing-proxy`` command."""

from .cli.main import main

raise SystemExit(main())
