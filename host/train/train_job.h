/* The multi-host training job run by every agent (see train_job.c). */
#ifndef MESHRUN_TRAIN_JOB_H
#define MESHRUN_TRAIN_JOB_H

#include "host/agent/agent.h"
#include "host/train/run.h"

struct train_job_arg {
	struct run_opts opts;
};

/* agent_job_fn for training; job_arg is a struct train_job_arg. */
int train_job(struct device_ctx *dev);

#endif
