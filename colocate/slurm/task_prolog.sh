#!/bin/sh
# colocate's Slurm TaskProlog: turns colocate's runtime on in a task, for sites that do not build the
# SPANK plugin (spank_colocate.c). slurm.conf: TaskProlog=/path/to/this/file. Slurm runs it as the user
# before each task, in the task's environment, and applies the `export NAME=VALUE` lines it prints.
#
# A task asks for colocate with COLOCATE_SLURM=auto|guaranteed|opportunistic in its environment (srun passes
# the user's environment on), or its job asked for the GRES OPP_GRES (opportunistic), or it holds GPU shards
# while ENFORCE=shard (or all), or any Slurm GPU while ENFORCE=all; it may lower its share or cap with
# COLOCATE_SM_SHARE / COLOCATE_GPU_MEM. colocate.slurm.worker.resolve maps the grant when torch is imported.
# Any other task is left untouched. `colocate slurm config --task-prolog FILE` writes this file with the
# site's settings below filled in.
# --- site settings (colocate slurm config) ---
INJECT=""
ROOT=""
NODE=""
SHARDS=""
DEVICE="sim"
SIM_GPU_MEM=""
ENFORCE="shard"
OPP_GRES=""
# --- end of site settings ---

if [ -z "${COLOCATE_SLURM:-}" ] && [ -n "$OPP_GRES" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    # a job that asked for the count-only GRES is opportunistic (one slurmctld query per task)
    if ! job=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null); then
        COLOCATE_SLURM=scontrol-failed  # fail closed: the runtime refuses this value in one line
        echo "export COLOCATE_SLURM=$COLOCATE_SLURM"
    elif printf '%s' "$job" | grep -Eq "gres[:/]$OPP_GRES([:,;= ]|\$)"; then
        COLOCATE_SLURM=opportunistic
        echo "export COLOCATE_SLURM=$COLOCATE_SLURM"
    fi
fi
if [ -z "${COLOCATE_SLURM:-}" ]; then
    shards=${SLURM_SHARDS_ON_NODE:-0}
    gpus=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}
    case "$ENFORCE" in  # otherwise: not a colocate task, untouched
        all) [ "$shards" != "0" ] || [ -n "$gpus" ] || exit 0 ;;
        shard) [ "$shards" != "0" ] || exit 0 ;;
        *) exit 0 ;;
    esac
    echo "export COLOCATE_SLURM=auto"
fi
endpoint=$(printf '%s' "$NODE" | sed "s/%n/${SLURMD_NODENAME:-}/g")
echo "export COLOCATE_ENABLED=1"
echo "export COLOCATE_ENGINE=slurm"
echo "export COLOCATE_NODE=$endpoint"
echo "export COLOCATE_NODE_REQUIRED=1"
echo "export COLOCATE_DEVICE=$DEVICE"
[ -n "$SHARDS" ] && echo "export COLOCATE_SLURM_SHARDS=$SHARDS"
[ -n "$SIM_GPU_MEM" ] && echo "export COLOCATE_SIM_GPU_MEM=$SIM_GPU_MEM"
echo "export PYTHONPATH=$INJECT${ROOT:+:$ROOT}${PYTHONPATH:+:$PYTHONPATH}"
exit 0
