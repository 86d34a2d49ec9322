#!/usr/bin/env bash
# One chorus training job started by Open MPI's mpirun (docs/deploy.md, "mpirun").
#
# mpirun starts the processes; each runs `chorus train` as one rank of one job: no chorus agent
# runs, rank 0 hosts the job's store at CHORUS_RDZV_ENDPOINT, and every rank proves it belongs to
# the job with the secret in CHORUS_SECRET_FILE (a mode-600 file). Each rank takes its device from
# the job's `devices`: one device per rank of the job (in rank order), or one per rank of a host
# (indexed by the rank's place on its host), or a single device for all ranks.
#
# This host only (3 ranks, three emulated CPUs of different speeds):
#   examples/mpi/train.sh
# Several hosts (mpirun reaches them over ssh; ranks 0 and 1 on host1, rank 2 on host2):
#   HOSTS=host1:2,host2:1 DEVICES=cuda:0,cuda:1,cuda:0 examples/mpi/train.sh
#   which runs, in effect:
#     mpirun -np 3 -H host1:2,host2:1 --bind-to none \
#       -x CHORUS_RDZV_ENDPOINT=<host1's address>:29500 -x CHORUS_SECRET_FILE=$HOME/.chorus/job.secret \
#       chorus train --set devices=cuda:0,cuda:1,cuda:0
# Extra arguments go to `chorus train`: a config file, --set KEY=VALUE, --steps N, --log-json F.
#
# As root (a container), Open MPI wants --allow-run-as-root; with more ranks than cores on a host,
# --oversubscribe: MPIRUN_OPTIONS="--allow-run-as-root --oversubscribe" examples/mpi/train.sh
set -euo pipefail

CHORUS="${CHORUS:-chorus}"                      # the chorus binary, on every host at this path
HOSTS="${HOSTS:-}"                              # mpirun -H host:slots,...; empty: this host
DEVICES="${DEVICES:-cpu,cpu@0.5,cpu@0.25}"      # see above; also decides -np when HOSTS is empty
PORT="${PORT:-29500}"                           # the store's port on the first host (open it)
SECRET_FILE="${SECRET_FILE:-$HOME/.chorus/job.secret}"
read -r -a mpirun_options <<<"${MPIRUN_OPTIONS:-}"

# The job secret: generated once, mode 600 (a file others can read is refused). Every host needs
# the same file at the same path: a shared home directory, or copy it (scp -p).
if [[ ! -f "$SECRET_FILE" ]]; then
  (umask 077 && mkdir -p "$(dirname "$SECRET_FILE")" && openssl rand -hex 32 >"$SECRET_FILE")
fi

# The ranks: one per listed device on this host, or the sum of the -H slots.
if [[ -z "$HOSTS" ]]; then
  IFS=, read -r -a listed <<<"$DEVICES"
  ranks=${#listed[@]}
  first_host=127.0.0.1
  host_options=()
else
  ranks=0
  IFS=, read -r -a slots <<<"$HOSTS"
  for slot in "${slots[@]}"; do ranks=$((ranks + ${slot##*:})); done
  # mpirun places rank 0 on the first host, so the store is there.
  first_host="$(getent ahostsv4 "${HOSTS%%:*}" | awk '{ print $1; exit }')"
  [[ -n "$first_host" ]] || { echo "train.sh: cannot resolve ${HOSTS%%:*}" >&2; exit 2; }
  host_options=(-H "$HOSTS")
fi

# Each rank's collectives listen on its host's address on the route toward the first host (as
# chorus's own agent picks it; CHORUS_BIND_ADDRESS overrides it).
exec mpirun -np "$ranks" "${host_options[@]}" --bind-to none "${mpirun_options[@]}" \
  -x CHORUS_RDZV_ENDPOINT="$first_host:$PORT" \
  -x CHORUS_SECRET_FILE="$SECRET_FILE" \
  "$CHORUS" train --set devices="$DEVICES" "$@"
