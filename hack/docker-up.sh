#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine: install docker.io if dockerd is missing,
# start dockerd in the background if nothing answers, and wait for its socket. Idempotent.
set -euo pipefail

answers() { docker info >/dev/null 2>&1; }

if answers; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "==> installing docker.io" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
# A dockerd that is still starting (or still shutting down) must be waited for, not doubled.
for _ in $(seq 1 120); do
  pgrep -x dockerd >/dev/null 2>&1 || break
  if answers; then
    exit 0
  fi
  sleep 0.5
done
if pgrep -x dockerd >/dev/null 2>&1; then
  echo "a dockerd process runs but does not answer after 60s; stop it and run this again" >&2
  exit 1
fi
# No dockerd runs: a pid file left by one that was killed would stop the new one.
rm -f /var/run/docker.pid
log=/var/log/driversdk-dockerd.log
echo "==> starting dockerd (log: $log)" >&2
# Its own session so it outlives this script and the test run's process group.
setsid dockerd >"$log" 2>&1 < /dev/null &
for _ in $(seq 1 120); do
  if answers; then
    exit 0
  fi
  sleep 0.5
done
echo "dockerd did not answer within 60s; the end of its log:" >&2
tail -n 30 "$log" >&2 || true
exit 1
