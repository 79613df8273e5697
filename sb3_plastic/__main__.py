"""``python -m sb3_plastic``: the ``sb3-plastic`` command (:mod:`sb3_plastic.cli`)."""

import sys

from sb3_plastic.cli import main

sys.exit(main())
