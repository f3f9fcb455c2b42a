#!/bin/sh
# gpusched's container entrypoint: the database URLs hold a password, so they come from secret files
# mounted at run time (compose `secrets:`), never from the image or the container's configuration.
# For each NAME below, NAME_FILE (a path) is read into NAME; setting both is an error. Then the
# container's command runs in this process's place.
set -eu
for name in GPUSCHED_DATABASE_URL GPUSCHED_GATEWAY_DATABASE_URL; do
  eval "file=\${${name}_FILE:-}"
  [ -n "$file" ] || continue
  eval "given=\${${name}+set}"
  if [ -n "$given" ]; then
    echo "gpusched-entrypoint: both $name and ${name}_FILE are set; set one" >&2
    exit 64
  fi
  if [ ! -r "$file" ]; then
    echo "gpusched-entrypoint: ${name}_FILE=$file cannot be read (is the secret mounted, readable by uid $(id -u)?)" >&2
    exit 66
  fi
  value=$(cat "$file")
  export "$name=$value"
  unset "${name}_FILE"
done
exec "$@"
