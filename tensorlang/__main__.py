"""cli: `python -m tensorlang` is the `tensorlang` command."""

import sys

from .cli import main

sys.exit(main())
