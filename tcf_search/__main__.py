"""``python -m tcf_search`` is the ``tcf-search`` command."""

from __future__ import annotations

import sys

from tcf_search.cli import main

sys.exit(main())
