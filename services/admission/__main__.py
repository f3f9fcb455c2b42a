import asyncio

from services.admission.app import main

asyncio.run(main())
