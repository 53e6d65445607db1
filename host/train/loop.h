/* The one step loop, used by single-device `train` and by the agents'
 * training job: runs the steps, stops on a non-finite loss, logs on
 * log_period, checkpoints on checkpoint_period and after the last step.
 * What differs between the two is passed in: the collectives (comm),
 * which device logs and writes (leader), and optional hooks for the job's
 * traces and byte counters. */
#ifndef MESHRUN_LOOP_H
#define MESHRUN_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "host/ckpt/hf_load.h"
#include "host/ckpt/resume.h"
#include "host/obs/steplog.h"
#include "host/train/train.h"

/* The run flags of `train`, `agent` and `local`. */
struct train_opts {
	const char *metrics;      /* --metrics FILE */
	const char *ckpt_dir;     /* --checkpoint-dir DIR */
	const char *trace;        /* --trace FILE */
	bool resume;              /* --resume */
	bool quiet;               /* --quiet: no step log on stdout */
	/* --restart N, set by a launcher: this is the job's Nth restart
	 * (0: its first launch); host faults fire only in the first */
	int restart;
	/* load_parameters_path opened for this host's devices (NULL: the
	 * weights are initialised, or --resume loads the run's own
	 * checkpoint); the command opens and closes it */
	struct hf_src *weights;
	/* --resume: the run's newest checkpoint opened for this host's
	 * devices, each to read its own shards (NULL: this host cannot read
	 * it; then host 0 reads it whole and sends it) */
	struct ckpt_resume *resume_from;
};

struct train_loop {
	struct trainer *t;
	const struct train_opts *opts;
	int global_rows, row0;            /* this device's rows of the batch */
	const struct train_comm *comm;    /* NULL on one device */
	bool leader;                      /* logs, writes metrics and checkpoints */
	struct steplog *log;              /* the leader's (train_log_open) */
	/* optional (NULL: nothing), called with ctx on every device */
	void (*step_begin)(void *ctx, int64_t step);
	void (*step_end)(void *ctx, const struct step_stats *st, double t0, double t1);
	/* cumulative counters: bytes sent over DCN and ICI, messages sent
	 * (every device of this host), seconds blocked in communication
	 * (comm_wait_s), seconds background collectives ran (comm_bg_s) */
	void (*bytes)(void *ctx, uint64_t *dcn, uint64_t *ici, uint64_t *msgs);
	/* cumulative: links this host resumed, frames it sent again doing so */
	void (*recovery)(void *ctx, uint64_t *reconnects, uint64_t *frames_resent);
	double (*comm_wait_s)(void *ctx);
	double (*comm_bg_s)(void *ctx);
	void *ctx;
	/* results: the leader's first and last loss */
	double first_loss, last_loss;
};

/* Runs steps [start, steps). 0, or -errno with err: a failed step's,
 * checkpoint's or step log's (a metrics line that could not be written),
 * -ERANGE for a non-finite loss. */
int train_loop_run(struct train_loop *l, int64_t start, char *err, size_t errlen);

/* Measures the sgemm peak, prints the step log's header and opens the
 * metrics file (appending on --resume) for a job of `devices` devices
 * whose host's links are protected as `links` says (NULL or "": no links).
 * 0 or -errno (the metrics file or stdout) with err. */
int train_log_open(struct steplog *log, const struct train_opts *o, struct trainer *t,
		   int devices, const char *links, char *err, size_t errlen);

#endif
