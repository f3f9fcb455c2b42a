"""``python -m services.simulator`` runs the ``simulate`` command without the gpusched CLI."""

import sys

from .cli import main

sys.exit(main())
