"""`python -m gateway` is `taskgate`."""

import sys

from gateway.cli import main

sys.exit(main())
