import sys

from services.queue_sim.cli import main

sys.exit(main())
