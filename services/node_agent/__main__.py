import asyncio

from services.node_agent.app import main

asyncio.run(main())
