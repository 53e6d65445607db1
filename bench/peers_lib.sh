# Shared by bench/peers.sh and bench/goals19.sh (sourced, not run): the
# three implementations of a collective, each run once and printing the
# lines bench/peers_summary.py parses. Run from the repository's root.

# Installs Open MPI and python3-torch (gloo) from Debian if missing, builds
# meshrun and bench/mpi_coll.c.
peers_setup() {
  local need=""
  command -v mpicc >/dev/null || need="$need openmpi-bin libopenmpi-dev"
  /usr/bin/python3 -c 'import torch' 2>/dev/null || need="$need python3-torch"
  if [ -n "$need" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
  fi
  make -s all
  mpicc -O2 -o build/mpi_coll bench/mpi_coll.c
}

# peers_meshrun HOSTS DEVICES OP SIZE ITERS WARMUP [flags and key=value ...]
# (the caller prints "# meshrun OP" before an op's sizes); MR_BIN: the
# build (default build/meshrun)
peers_meshrun() {
  local h=$1 d=$2 op=$3 size=$4 iters=$5 warm=$6
  shift 6
  "${MR_BIN:-build/meshrun}" bench collectives --hosts "$h" --devices-per-host "$d" --op "$op" \
    --sizes "$size" --iters "$iters" --warmup "$warm" "$@"
}

# peers_mpi RANKS ITERS_16M ITERS_64K ITERS_1M [--barrier]: every op; a
# size with 0 iterations is skipped
peers_mpi() {
  local ranks=$1
  shift
  echo "# Open MPI (unencrypted)"
  mpirun --allow-run-as-root --oversubscribe -np "$ranks" --mca btl tcp,self \
    --mca btl_tcp_if_include lo --mca pml ob1 build/mpi_coll "$@"
}

# peers_gloo RANKS ITERS_16M ITERS_64K ITERS_1M [--barrier]: every op gloo
# has; a size with 0 iterations is skipped
peers_gloo() {
  local ranks=$1 i16=$2 i64=$3 i1=$4
  shift 4
  echo "# gloo (unencrypted)"
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/gloo_coll.py $(( 20000 + RANDOM % 20000 )) \
    "$i16" "$i64" all "$ranks" "$i1" "$@"
}
