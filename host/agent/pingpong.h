/* The agents' self-test job "pingpong". */
#ifndef MESHRUN_PINGPONG_H
#define MESHRUN_PINGPONG_H

#include <stddef.h>

#include "host/agent/agent.h"

struct pingpong_arg {
	size_t size;       /* bytes per message */
	long rounds;
	double hold_s;     /* linger after the last round: a slow finisher */
};

/* An agent_job_fn; dev->job_arg is a const struct pingpong_arg. 0 or
 * -errno: -EHOSTDOWN when a peer is lost, -EIO when a byte arrives wrong. */
int pingpong_job(struct device_ctx *dev);

#endif
