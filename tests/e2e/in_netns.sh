#!/usr/bin/env bash
# Runs a command in a network namespace of its own with loopback up, so that it can
# listen on fixed ports (the README's :50051, :8000, :8080) whatever else runs on this
# machine, and reach nothing beyond it. As root a plain namespace; otherwise also a user
# namespace that maps the caller to root in it.
set -euo pipefail
user=()
[[ "$(id -u)" -eq 0 ]] || user=(--map-root-user)
exec unshare "${user[@]}" --net bash -c 'ip link set lo up && exec "$@"' in_netns "$@"
