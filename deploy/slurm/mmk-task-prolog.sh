#!/bin/sh
# Slurm TaskProlog for mmk (docs/cluster.md, "Slurm"): every task of every job step gets an
# mmk partition and MPS share before it starts.
#
# slurmd runs this as the job's user, with the task's environment, just before the task
# execs; SLURM_TASK_PID is the task's own pid (its program keeps that pid). The script asks
# mmkd for an attached allocation that ends when that process ends, waits for it to be
# placed, and prints `export NAME=value` lines, which slurmd adds to the task's
# environment (CUDA_VISIBLE_DEVICES, CUDA_MPS_PIPE_DIRECTORY,
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, LD_PRELOAD, MMK_JOB_ID, ...).
#
# The job's class: MMK_CLASS (online or offline) if the job sets it (sbatch
# --export=ALL,MMK_CLASS=online), else online when the job's partition is one of
# MMK_ONLINE_PARTITIONS (default "online"), else offline. Its GPU memory: MMK_MEMORY
# (default 10GiB); its workload profile: MMK_PROFILE. How long a task may wait for room:
# MMK_WAIT (default 10m). Settings for the whole cluster go in this file's environment
# (slurm.conf cannot pass any), so set them here or in /etc/default/mmk.

[ -r /etc/default/mmk ] && . /etc/default/mmk

mmkctl=${MMKCTL:-mmkctl}
case "${MMK_CLASS:-}" in
online | offline) class=$MMK_CLASS ;;
"")
    case ",${MMK_ONLINE_PARTITIONS:-online}," in
    *",${SLURM_JOB_PARTITION:-},"*) class=online ;;
    *) class=offline ;;
    esac
    ;;
*)
    echo "print mmk: MMK_CLASS=$MMK_CLASS is neither online nor offline"
    exit 1
    ;;
esac

set -- allocate "--$class" --pid "$SLURM_TASK_PID" \
    --memory "${MMK_MEMORY:-10GiB}" \
    --name "slurm-${SLURM_JOB_ID}.${SLURM_STEP_ID:-0}.${SLURM_PROCID:-0}" \
    --wait "${MMK_WAIT:-10m}" --export
[ -n "${MMK_PROFILE:-}" ] && set -- "$@" --profile "$MMK_PROFILE"
[ -n "${MMK_SOCKET:-}" ] && set -- --socket "$MMK_SOCKET" "$@"

# stdout carries the export lines; on failure, say why on the task's output and fail it.
if ! out=$("$mmkctl" "$@" 2>&1); then
    echo "print mmk: no GPU partition for this task: $out"
    exit 1
fi
printf '%s\n' "$out"
