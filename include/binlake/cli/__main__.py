"""``python -m binlake.cli``: the ``binlake`` command (as the console script runs it)."""

from __future__ import annotations

from binlake.cli import main

raise SystemExit(main())
