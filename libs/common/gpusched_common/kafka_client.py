"""How a gpusched process connects to Kafka: the security settings of `Settings`, turned into the options
of aiokafka's clients and of faststream's broker. Every Kafka client in the codebase is built with these,
so one set of GPUSCHED_KAFKA_* variables secures the whole process."""

from __future__ import annotations

import ssl
from typing import Any

from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512

from gpusched_common.settings import Settings


class KafkaSecurityError(ValueError):
    """The Kafka security settings are incomplete or contradictory."""


def _password(settings: Settings) -> str | None:
    if settings.kafka_sasl_password_file is not None:
        try:
            return settings.kafka_sasl_password_file.read_text().strip()
        except OSError as exc:
            raise KafkaSecurityError(f"cannot read GPUSCHED_KAFKA_SASL_PASSWORD_FILE: {exc}") from exc
    return settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else None


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    if "SSL" not in settings.kafka_security_protocol:
        return None
    cafile = str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
    return ssl.create_default_context(cafile=cafile)  # verifies the certificate and the host name


def _credentials(settings: Settings) -> tuple[str, str]:
    password = _password(settings)
    if not settings.kafka_sasl_username or password is None:
        raise KafkaSecurityError(f"GPUSCHED_KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol} needs "
                                 "GPUSCHED_KAFKA_SASL_USERNAME and a password (GPUSCHED_KAFKA_SASL_PASSWORD_FILE)")
    return settings.kafka_sasl_username, password


def client_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for AIOKafkaProducer/Consumer/AdminClient."""
    protocol = settings.kafka_security_protocol
    options: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap, "security_protocol": protocol}
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if protocol.startswith("SASL"):
        username, password = _credentials(settings)
        options.update(sasl_mechanism=settings.kafka_sasl_mechanism, sasl_plain_username=username,
                       sasl_plain_password=password)
    return options


def broker_security(settings: Settings) -> BaseSecurity | None:
    """The same settings for faststream's KafkaBroker."""
    protocol = settings.kafka_security_protocol
    context = ssl_context(settings)
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return BaseSecurity(ssl_context=context, use_ssl=True)
    username, password = _credentials(settings)
    use_ssl = protocol == "SASL_SSL"
    kind = {"SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512,
            "PLAIN": SASLPlaintext}[settings.kafka_sasl_mechanism]
    return kind(username, password, ssl_context=context, use_ssl=use_ssl)
