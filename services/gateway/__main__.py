import uvicorn

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings

settings = GatewaySettings()
uvicorn.run(create_app(settings), host=settings.gateway_host, port=settings.gateway_port,
            log_level=settings.log_level.lower(), timeout_keep_alive=int(settings.gateway_read_timeout_s))
