import asyncio

from services.quota.app import main

asyncio.run(main())
