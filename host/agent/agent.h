/* One host's agent: rendezvous with the other hosts over TLS, one device
 * thread per local device running a job (SPMD), clean shutdown or abort.
 * Jobs (training, benchmarks, self-tests) plug in as a function. */
#ifndef MESHRUN_AGENT_H
#define MESHRUN_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "net/xport.h"

struct agent;

struct device_ctx {
	struct agent *agent;
	const struct cfg *cfg;
	const struct mesh *mesh;
	struct xport *xport;
	int host_id;
	int local_index;          /* 0..devices_per_host-1 */
	int device_id;            /* global mesh id */
	void *job_arg;            /* shared by all devices of the host */
	/* a job that fails fills err and returns non-zero (an enum exit_code) */
	char err[512];
};

/* Runs on every device thread. Returns 0 or an exit code; err explains. */
typedef int (*agent_job_fn)(struct device_ctx *dev);

/* Blocks until every local device's job has returned on every host (or a
 * failure aborted the job). Returns an exit code; err has the one-line
 * reason. */
int agent_run(const struct cfg *cfg, int host_id, agent_job_fn job, void *job_arg,
	      char *err, size_t errlen);

/* Bytes this host sent over DCN links so far (for step logs). */
uint64_t agent_dcn_bytes_sent(struct agent *a);
/* TLS sending keys this agent renewed on its links so far. */
uint64_t agent_tls_key_updates(struct agent *a);

#endif
