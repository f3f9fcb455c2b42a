"""The admission service's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from gpusched_common.settings import Settings


class AdmissionSettings(Settings):
    # submissions each tenant may make: a token bucket refilled at this rate, holding this many at most
    admission_rate_per_s: float = 500.0
    admission_rate_burst: float = 5000.0
    # every submission must carry a producer's (or a tenant key's) credential: authentication fails
    # closed; off (false) only for development, where a submission without any credential is believed
    admission_require_credentials: bool = True
