import asyncio

from services.placement.app import main

asyncio.run(main())
