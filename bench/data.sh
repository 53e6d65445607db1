#!/usr/bin/env bash
# The data path against the corpus size (docs/data.md, bench/results/loading-and-data.md#data).
# Corpora: llm.c shards (uint16, 100M-token shards written by `meshrun data
# pack` from random bytes) of 10 MiB, 100 MiB, 1 GiB and 2 GiB on disk, and
# a 2 GiB Megatron dataset of 1,048,576 documents of 1,024 tokens (its
# index, 20 MiB, is read whole at open). Baseline in the same run: the
# text file of the configs (GPL-3, 35 KiB).
#
# Part 1, llama-bench (configs/llama-bench.yml: rows of 257 tokens, 8 per
# device) on 2 hosts x 1 device over loopback, STEPS steps per corpus:
#   step_s     median step time over steps >= 2 (host 0's metrics)
#   data_ms    median data_time_s there: host 0's device reading its rows
#              (the permutation, pread, decoding into the model's buffer)
#   data/step  data_ms / step_s
#   rss0/rss1  each host's peak resident MiB (VmHWM, polled every 0.2 s)
# Part 2, time to the first step: `meshrun train` (one device,
# llama-tiny with vocab_size 65536, rows of 65 tokens, 1 step): median
# wall and CPU seconds of ROUNDS interleaved rounds, and the ratios to the
# text baseline's.
# The corpora are in the page cache after they are written (this script
# does not drop caches: the machine is shared); rows are then memory
# copies, and a cold disk would add one random read per row.
# usage: [ROUNDS=3] bench/data.sh [STEPS] [WORKDIR]   (WORKDIR keeps 5 GiB of corpora)
set -eu
cd "$(dirname "$0")/.."
steps=${1:-5}
work=${2:-/tmp/meshrun-bench-data}
rounds=${ROUNDS:-3}
bin=$PWD/build/meshrun
make -s all
mkdir -p "$work"
# one random text of 1 GiB; an llm.c corpus of S bytes packs its first S/2
# bytes (one uint16 token each)
[ -s "$work/rand.txt" ] || head -c 1G /dev/urandom >"$work/rand.txt"
for s in 10M 100M 1G 2G; do
  [ -d "$work/c$s" ] && continue
  n=$(numfmt --from=iec "$s")
  head -c $((n / 2)) "$work/rand.txt" >"$work/in.txt"
  "$bin" data pack --format llmc --shard-tokens 100M --name c "$work/in.txt" -o "$work/c$s" >/dev/null
done
rm -f "$work/in.txt"
if [ ! -s "$work/meg.idx" ]; then
  cat "$work/rand.txt" "$work/rand.txt" >"$work/meg.bin"
  python3 - "$work/meg.idx" <<'EOF'
import array, struct, sys
n, L = 1 << 20, 1024          # documents (one sequence each) of L uint16 tokens
with open(sys.argv[1], "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1))
    f.write(array.array("i", [L] * n).tobytes())
    f.write(array.array("q", range(0, 2 * L * n, 2 * L)).tobytes())
    f.write(array.array("q", range(n + 1)).tobytes())
EOF
fi

echo "# $(date -u +%F) load $(cut -d' ' -f1-3 /proc/loadavg), $steps steps, $rounds rounds"
# part 1: run NAME ARGS...: one `meshrun local --hosts 2`, its agents polled
run() {
  local name=$1; shift
  local m=$work/$name.jsonl
  rm -f "$m"
  "$bin" local --hosts 2 --config configs/llama-bench.yml steps=$steps "$@" --metrics "$m" \
    --quiet >"$work/$name.log" 2>&1 &
  local pid=$! h0=0 h1=0
  while kill -0 $pid 2>/dev/null; do
    for a in $(pgrep -P $pid || true); do
      h=$({ tr '\0' ' ' </proc/$a/cmdline; } 2>/dev/null | sed -n 's/.*--host-id \([0-9]*\).*/\1/p')
      k=$({ awk '/VmHWM/ {print $2}' </proc/$a/status; } 2>/dev/null || true)
      [ -n "$k" ] || continue
      k=$((k / 1024))
      [ "$h" = 0 ] && [ $k -gt $h0 ] && h0=$k
      [ "$h" = 1 ] && [ $k -gt $h1 ] && h1=$k
    done
    sleep 0.2
  done
  wait $pid || { cat "$work/$name.log"; exit 1; }
  python3 - "$m" "$name" $h0 $h1 <<'EOF'
import json, statistics, sys
m, name, h0, h1 = sys.argv[1:]
late = [r for r in map(json.loads, open(m)) if r["step"] >= 2]
step = statistics.median(r["step_time_s"] for r in late)
data = statistics.median(r["data_time_s"] for r in late)
print("%-12s %7.3f %8.3f %10.5f%% %6s %6s" % (name, step, data * 1e3, 100 * data / step, h0, h1))
EOF
}
echo "## part 1: llama-bench, 2 hosts x 1 device"
printf "%-12s %7s %8s %11s %6s %6s\n" run step_s data_ms data/step rss0 rss1
run text
for s in 10M 100M 1G 2G; do
  run "llmc-$s" dataset_type=llmc "dataset_path=$work/c$s"
done

# part 2: each round runs every corpus once (rotated, so load that drifts
# during the part falls on all of them); per corpus the median wall and
# CPU (user + system) seconds of `train` to the end of step 0
names=(text llmc-10M llmc-100M llmc-1G llmc-2G megatron-2G)
args=("" "dataset_type=llmc dataset_path=$work/c10M" "dataset_type=llmc dataset_path=$work/c100M"
      "dataset_type=llmc dataset_path=$work/c1G" "dataset_type=llmc dataset_path=$work/c2G"
      "dataset_type=megatron dataset_path=$work/meg")
rm -f "$work/first.txt"
for r in $(seq "$rounds"); do
  for i in "${!names[@]}"; do
    k=$(( (i + r) % ${#names[@]} ))
    # shellcheck disable=SC2086
    /usr/bin/time -f "%e %U %S" -o "$work/time.txt" "$bin" train --config configs/llama-tiny.yml \
      vocab_size=65536 per_device_batch_size=2 steps=1 --quiet ${args[$k]} >"$work/first.log" 2>&1 ||
      { cat "$work/first.log"; exit 1; }
    echo "${names[$k]} $(cat "$work/time.txt")" >>"$work/first.txt"
  done
done
echo "## part 2: time to the first step, 1 device (median of $rounds)"
python3 - "$work/first.txt" "${names[@]}" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda n, f: statistics.median(f(r) for r in rows if r[0] == n)
wall = lambda r: float(r[1])
cpu = lambda r: float(r[2]) + float(r[3])
print("%-12s %8s %8s %8s %8s" % ("run", "wall_s", "vs_text", "cpu_s", "vs_text"))
for n in sys.argv[2:]:
    print("%-12s %8.3f %7.2fx %8.3f %7.2fx" % (n, med(n, wall), med(n, wall) / med("text", wall),
                                             med(n, cpu), med(n, cpu) / med("text", cpu)))
EOF
echo "# after: load $(cut -d' ' -f1-3 /proc/loadavg)"
