import sys

import uvicorn
from pydantic import ValidationError

from gpusched_common.producers import read_key_file
from gpusched_common.runtime import configure_logging
from gpusched_common.tracing import configure_tracing

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings

try:
    settings = GatewaySettings()
except ValidationError as exc:
    sys.exit(f"gateway: invalid settings: {exc}")
if settings.gateway_producer_key_file is not None and read_key_file(settings.gateway_producer_key_file) is None:
    sys.exit(f"gateway: {settings.gateway_producer_key_file} holds no producer key (gsk_...): run `gpusched "
             "gateway-init` or `gpusched producers create --attests`")
configure_logging(settings, "gateway")
provider = configure_tracing("gateway", settings)
try:
    uvicorn.run(create_app(settings), host=settings.gateway_host, port=settings.gateway_port,
                log_level=settings.log_level.lower(), timeout_keep_alive=int(settings.gateway_read_timeout_s))
finally:
    if provider is not None:
        provider.shutdown()
