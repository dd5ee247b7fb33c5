"""``python -m regency``: the ``regency`` command line."""

import sys

from regency.cli import main

sys.exit(main())
