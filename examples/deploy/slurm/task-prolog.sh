#!/usr/bin/env bash
# Slurm TaskProlog for sluice (slurm.conf: TaskProlog=/etc/slurm/sluice-task-prolog.sh).
#
# Slurm runs it before each task as the job's user and reads its standard
# output: each `export NAME=VALUE` line is set in the task's environment.
# It points the task's sluice clients at the node's server and names the
# application after the job, so the scheduler shares the device between
# jobs, not between processes.
#
# Without it the clients still name themselves `slurm-$SLURM_JOB_ID` (the
# client's default when SLURM_JOB_ID is set); a job array's tasks are
# then one application per array task. Here the whole array is one
# application, and an application name the user set is kept.
set -u
socket=${SLUICE_SOCKET:-/run/sluice/sluice.sock}
if [ -z "${SLUICE_SERVER:-}" ]; then
  echo "export SLUICE_SERVER=unix:${socket}"
fi
if [ -z "${SLUICE_APP:-}" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "export SLUICE_APP=slurm-${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"
fi
exit 0
