/* The multi-host training job run by every agent (see train_job.c). */
#ifndef MESHRUN_TRAIN_JOB_H
#define MESHRUN_TRAIN_JOB_H

#include "host/agent/agent.h"

/* An agent_job_fn for training; dev->job_arg is a const struct
 * train_opts (host/train/loop.h). 0 or -errno with dev->err. */
int train_job(struct device_ctx *dev);

#endif
