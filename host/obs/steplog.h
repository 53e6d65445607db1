/* The step log (MaxText-like lines on stdout) and the --metrics file (one
 * JSON object per logged step). Field names say what they measure:
 * tokens_per_s_global counts every device's tokens, the step log's
 * Tokens/s/device and tokens_per_s_per_device one device's share. */
#ifndef MESHRUN_STEPLOG_H
#define MESHRUN_STEPLOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "host/util/out.h"

enum steplog_mode {
	STEPLOG_LINES,            /* one line per logged step (not a terminal) */
	STEPLOG_PROGRESS,         /* one updating line: stdout is a terminal */
	STEPLOG_QUIET,            /* nothing on stdout (--quiet) */
};

struct steplog {
	bool opened;              /* steplog_open ran (a zeroed steplog is closed) */
	struct util_log metrics;  /* fd -1: no --metrics */
	enum steplog_mode mode;
	int64_t total_steps;
	double step_s_sum;        /* for the ETA: logged steps' time */
	int64_t steps_seen;
	bool line_open;           /* a progress line waits for its newline */
	double peak_gflops;       /* measured sgemm peak per device */
	double flops_per_token;
	int devices;              /* devices in the job */
	int64_t tokens_per_step;  /* global */
};

/* What the run looks like, for the header line and the rates. */
struct steplog_info {
	double peak_gflops;
	int blas_threads;
	const char *blas_core;
	const char *kernel_isa;   /* our elementwise kernels' (kernels/isa.c) */
	double flops_per_token;   /* matmul FLOPs per token */
	int64_t tokens_per_step;  /* every device's */
	int devices;
	int64_t total_steps;      /* the run's last step + 1 (for the progress line) */
	bool quiet;               /* --quiet: no header, no step lines */
	const char *links;        /* what protects the host's links (NULL, "": none) */
};

/* What one step measured. */
struct step_report {
	int64_t step;
	double loss, aux, grad_norm, lr;
	double seconds;           /* wall time of the step */
	uint64_t dcn_bytes, ici_bytes;
	double comm_wait_s;       /* blocked on communication during the step
				   * (written as comm_exposed_s and, its
				   * older name, comm_wait_s) */
	double comm_bg_s;         /* background collectives ran during it */
	uint64_t messages;        /* sends posted by the logging host's devices */
	int weight_gathers;       /* FSDP layer-group all-gathers (0: none, not shown) */
	double window_copies;     /* floats the FSDP window copied on the logging
				   * device (with weight_gathers) */
	double muon_ns;           /* Muon's Newton-Schulz runs over the mesh (0: not shown) */
	double muon_bytes;        /* and the bytes sent for it (with muon_ns) */
	double muon_gflop[3];     /* their GFLOP: over the mesh, the busiest
				   * device's, the least busy device's */
	/* so far in the job: links resumed after breaking, frames resent */
	uint64_t reconnects, frames_resent;
	double data_s;            /* reading the logging device's rows */
	int64_t data_epoch;       /* the epoch of the step's first row; -1: no epochs */
	/* after an evaluation at this step: the held-out loss and its
	 * unmasked targets (eval_tokens 0: no evaluation) */
	double eval_loss;
	int64_t eval_tokens;
	/* pipeline_compute=sleep: the step slept in place of its compute, so
	 * loss, aux and grad_norm are no figures: the log prints "loss: -"
	 * and the metrics line "synthetic": "sleep" without them */
	bool synthetic;
	/* pipeline_update_ahead: what became of the step's update ("waited",
	 * "kept", "redone"; metrics "update_ahead"); NULL: the key is off */
	const char *ahead;
};

/* Prints the header line; opens metrics (NULL: none), appending when
 * append (a partial last line a crash left is cut first, and said so on
 * stderr). When stdout is a terminal the steps show as one updating line
 * (step/total, loss, tokens/s, ETA) instead of a line each; quiet prints
 * nothing. 0, or -errno when the metrics file cannot be opened, with err
 * naming it. */
int steplog_open(struct steplog *l, const struct steplog_info *info, const char *metrics,
		 bool append, char *err, size_t errlen);
/* Logs one step: the step log on stdout and a metrics line. Every write is
 * checked: 0, or -errno with err naming the file ("metrics: unable to
 * write 'm.jsonl': no space left on device"); the metrics file then keeps
 * its complete lines only. */
int steplog_step(struct steplog *l, const struct step_report *r, char *err, size_t errlen);
/* Ends the progress line, syncs and closes the metrics file. 0 or -errno
 * with err; closed either way. Safe on a log never opened or closed. */
int steplog_close(struct steplog *l, char *err, size_t errlen);
/* One line of news between steps ("data: epoch 1 begins ..."), printed
 * on its own line unless quiet. */
void steplog_note(struct steplog *l, const char *text);

#endif
