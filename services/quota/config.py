"""The tenant quota file (YAML): per-tenant GPU caps with a default."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field


class TenantQuota(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpu_cap: int = Field(ge=0)


class QuotaConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = 1
    default_gpu_cap: int = Field(default=64, ge=0)
    tenants: dict[str, TenantQuota] = Field(default_factory=dict)

    def cap_for(self, tenant: str) -> int:
        quota = self.tenants.get(tenant)
        return quota.gpu_cap if quota else self.default_gpu_cap


def load_quota_config(path: Path | None, default_cap: int) -> QuotaConfig:
    if path is None:
        return QuotaConfig(default_gpu_cap=default_cap)
    doc = yaml.safe_load(path.read_text()) or {}
    return QuotaConfig.model_validate(doc)
