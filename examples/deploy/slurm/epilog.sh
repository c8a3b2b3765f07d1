#!/usr/bin/env bash
# Slurm Epilog for sluice (slurm.conf: Epilog=/etc/slurm/sluice-epilog.sh).
#
# Slurm runs it as root on each node when a job ends. It logs what the
# job's application moved through the node's sluice server, read from the
# server's metrics endpoint (`sluice serve --metrics 127.0.0.1:9464`), one
# line per counter: `sluice: job 42 (slurm-42): sluice_app_bytes_total{...} N`.
#
# It never fails the job or drains the node: a missing server, curl or
# metrics endpoint is reported and the script exits 0.
set -u
job=${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-}}
if [ -z "$job" ]; then
  echo "sluice: epilog: no SLURM_JOB_ID; nothing to report" >&2
  exit 0
fi
app="slurm-${job}"
metrics=${SLUICE_METRICS:-http://127.0.0.1:9464/metrics}
if ! command -v curl >/dev/null 2>&1; then
  echo "sluice: job ${job} (${app}): curl is missing; no report" >&2
  exit 0
fi
if ! body=$(curl -fsS --max-time 5 "$metrics" 2>/dev/null); then
  echo "sluice: job ${job} (${app}): no metrics at ${metrics}; no report"
  exit 0
fi
lines=$(printf '%s\n' "$body" | grep -F "app=\"${app}\"" | grep '^sluice_app_' || true)
if [ -z "$lines" ]; then
  echo "sluice: job ${job} (${app}): no I/O through sluice on $(hostname)"
  exit 0
fi
printf '%s\n' "$lines" | while IFS= read -r l; do
  echo "sluice: job ${job} (${app}): ${l}"
done
exit 0
