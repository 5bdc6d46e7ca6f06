"""`python -m aisched` runs the `aisched` command."""

from __future__ import annotations

from aisched.cli.main import main

raise SystemExit(main())
