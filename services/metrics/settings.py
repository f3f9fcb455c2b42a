"""The metrics service's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from gpusched_common.settings import Settings


class MetricsSettings(Settings):
    metrics_log_interval_s: float = 10.0
    metrics_history_retention_s: float = 30 * 86_400.0  # utilization samples kept this long (issue 15)
    metrics_usage_retention_s: float = 14 * 86_400.0  # usage_samples kept this long (issue 17, the dashboard)
    metrics_port: int | None = None  # Prometheus scrape endpoint (/metrics); None: no endpoint
    metrics_host: str = "127.0.0.1"
    metrics_pool_label: str = "gpusched.io/pool"
    metrics_idle_threshold_pct: float = 5.0
    metrics_idle_after_s: float = 300.0  # allocated GPUs idle longer than this are reported with their jobs
    scale_out_window_s: float = 60.0
    scale_out_clear_s: float = 15.0
    scale_out_cooldown_s: float = 300.0
    scale_out_max_nodes: int = 16
    scale_in_idle_s: float = 600.0
    scale_in_cooldown_s: float = 300.0
    scale_min_nodes_per_model: int = 0
    scale_provision_timeout_s: float = 900.0
