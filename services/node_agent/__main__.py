"""`python -m services.node_agent` runs this node's agent (configured by GPUSCHED_* settings, as always);
with `--check` it prints the node's inventory, health and telemetry samples instead, and exits (check.py)."""

import asyncio
import sys

if "--check" in sys.argv[1:]:
    from services.node_agent.check import main as check

    sys.exit(check(sys.argv[1:]))
else:
    from services.node_agent.app import main

    asyncio.run(main())
