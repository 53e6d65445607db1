# Sourced by bench/sched.sh and bench/plan_pair.sh (needs $bin and $tmp):
# the schedule benches' model, llama-bench with 8 layers and sequences of
# 128 ($model, with ${KV:-} added), and the loopback TLS link measured
# with `$bin bench link` ($lat_us, $gbps: a 4 KiB message's time is the
# latency, 1 MiB's the bandwidth), printed on a line with the load.
model="--config configs/llama-bench.yml base_num_decoder_layers=8 max_target_length=128 per_device_batch_size=4"
model="$model ici_data_parallelism=1 dcn_data_parallelism=1 ${KV:-}"
"$bin" bench link --hosts 2 --sizes 4K,1M --iters 50 >$tmp/link 2>&1 || { cat $tmp/link; exit 1; }
lat_us=$(awk '$1 == 4096 {print $2}' $tmp/link)
gbps=$(awk -v l="$lat_us" '$1 == 1048576 {printf "%.3f", 8 * 1048576 / (($2 - l) * 1e3)}' $tmp/link)
echo "# link (bench link, loopback TLS): latency ${lat_us} us, ${gbps} Gbit/s; load $(cut -d' ' -f1-3 /proc/loadavg)"
