#!/bin/sh
# Writes the compose stack's secrets into deploy/secrets/ (run from anywhere; once, before the first
# `docker compose up`). Each file is kept if it exists, so running it again changes nothing; delete a
# file to make it anew (then recreate the containers that read it). The directory is mode 0700 (only
# you reach the files on this host); the files are 0644 so that uid 10001 in the containers can read
# them through compose's bind mounts. deploy/secrets/ is git-ignored and docker-ignored.
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
user="${POSTGRES_USER:-gpusched}"
db="${POSTGRES_DB:-gpusched}"
umask 022
mkdir -p "$dir"
chmod 0700 "$dir"

random() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }   # 48 hex characters: URL-safe as it is
keep() { [ -s "$dir/$1" ] && echo "kept    deploy/secrets/$1"; }
write() { printf '%s\n' "$2" > "$dir/$1"; chmod 0644 "$dir/$1"; echo "wrote   deploy/secrets/$1"; }

keep postgres-password || write postgres-password "$(random)"
keep gateway-db-password || write gateway-db-password "$(random)"
keep database-url ||
  write database-url "postgresql://$user:$(cat "$dir/postgres-password")@postgres:5432/$db"
keep gateway-database-url ||
  write gateway-database-url "postgresql://gpusched_gateway:$(cat "$dir/gateway-db-password")@postgres:5432/$db"
if ! keep tenant-keys.yaml; then
  # the example's key ids, each with a fresh secret: replace them with your teams' keys
  write tenant-keys.yaml "$(cat <<YAML
# Tenant HMAC keys (format and rotation: deploy/tenant-keys.example.yaml). Made by make-secrets.sh.
keys:
  research-1:
    tenant: research
    secret: $(random)
  inference-1:
    tenant: inference
    secret: $(random)
  platform-operator:
    tenant: "*"
    secret: $(random)
YAML
)"
fi
