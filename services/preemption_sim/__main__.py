import sys

from services.preemption_sim.cli import main

sys.exit(main())
