/* `meshrun bench load`: one host's part of loading a checkpoint
 * (host/ckpt/hf_load.h) timed on its own: the headers opened, then each
 * of the host's devices' shards read into a parameter buffer of its own,
 * without a trainer around it (no gradients, no optimizer state), so a
 * checkpoint larger than what training would fit in memory can be timed.
 * bench/load.sh runs one per host at once and times `cat` beside them. */
#ifndef MESHRUN_BENCH_LOAD_H
#define MESHRUN_BENCH_LOAD_H

struct cfg;

/* Loads c->load_parameters_path (c finished, its config.json applied) as
 * host host_id of c's mesh would, and prints one line: seconds, bytes
 * read, the host's share. 0 or -errno (message printed). A pipeline over
 * `stage` is refused (its layer order needs the schedule). */
int bench_load_run(const struct cfg *c, int host_id);

#endif
