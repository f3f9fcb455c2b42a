import asyncio

from services.preemption.app import main

asyncio.run(main())
