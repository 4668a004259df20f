"""``python -m pgc_hvd`` is the ``pgc-hvd`` command."""

import sys

from pgc_hvd.cli import main

sys.exit(main())
