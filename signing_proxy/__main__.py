"""``python -m signing_proxy`` is the ``signing-proxy`` command."""

from .cli.launch import main

raise SystemExit(main())
