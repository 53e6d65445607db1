/* Step log, metrics file and checkpoint cadence shared by single-device
 * `train` and the multi-host training job. */
#ifndef MESHRUN_RUN_H
#define MESHRUN_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "host/train/train.h"

struct run_opts {
	const char *metrics;      /* --metrics FILE */
	const char *ckpt_dir;     /* --checkpoint-dir DIR */
	const char *trace;        /* --trace FILE */
	bool resume;              /* --resume */
};

/* Parses the run flags out of argv (compacting it). 0 or EXIT_USAGE. */
int run_parse_flags(int *argc, char **argv, struct run_opts *o, char *err, size_t errlen);

struct run_log {
	FILE *metrics;
	double peak_gflops;       /* measured sgemm peak per device */
	double flops_per_token;
	int devices;              /* devices in the job */
	int64_t tokens_per_step;  /* global */
};

int run_log_open(struct run_log *l, const struct run_opts *o, const struct cfg *c,
		 const struct model_dims *d, int devices, char *err, size_t errlen);
void run_log_step(struct run_log *l, int64_t step, const struct step_stats *st, double seconds,
		  uint64_t dcn_bytes, uint64_t ici_bytes);
void run_log_close(struct run_log *l);

/* Sets OpenBLAS threads from openblas_threads or the rule
 * max(1, online cores / devices on this machine); returns the count. */
int run_blas_threads(const struct cfg *c, int devices_on_machine);

/* Agents sharing this machine: set by `meshrun local` for its children
 * (MESHRUN_LOCAL_AGENTS), else 1. */
int run_agents_on_machine(void);


#endif
