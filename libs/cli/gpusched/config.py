"""Where the gateway is and who you are, found like a kubeconfig: ``GPUSCHED_SERVER`` and ``GPUSCHED_TOKEN``,
else the file ``$GPUSCHED_CONFIG`` (default ``~/.config/gpusched/config.yaml``, keys ``server`` and
``token``, kept at mode 0600). ``gpusched up`` writes that file for the local stack."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class NoServer(RuntimeError):
    """Neither the environment nor the config file says where the gateway is."""


@dataclass(frozen=True)
class ClientConfig:
    server: str
    token: str | None = field(default=None, repr=False)


def config_path() -> Path:
    return Path(os.environ.get("GPUSCHED_CONFIG") or Path.home() / ".config" / "gpusched" / "config.yaml")


def read_config(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as exc:
        raise NoServer(f"{path}: not a gpusched config ({exc})") from None
    if not isinstance(doc, dict):
        raise NoServer(f"{path}: not a gpusched config (a mapping with server and token)")
    return {k: str(v) for k, v in doc.items() if k in ("server", "token") and v}


def resolve() -> ClientConfig:
    """The server and token to use: the environment first, then the config file."""
    stored = read_config()
    server = os.environ.get("GPUSCHED_SERVER") or stored.get("server")
    token = os.environ.get("GPUSCHED_TOKEN") or stored.get("token")
    if not server:
        raise NoServer(f"no gateway configured: set GPUSCHED_SERVER and GPUSCHED_TOKEN, write {config_path()} "
                       "(server:, token:), or start the local stack with `gpusched up`")
    return ClientConfig(server.rstrip("/"), token)


def write_config(server: str, token: str, path: Path | None = None) -> Path:
    """Write ``server`` and ``token`` to the config file, readable by its owner only."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.touch(mode=0o600)
    partial.chmod(0o600)
    partial.write_text(yaml.safe_dump({"server": server, "token": token}, sort_keys=False))
    partial.replace(path)
    return path
