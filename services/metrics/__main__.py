import asyncio

from services.metrics.app import main

asyncio.run(main())
