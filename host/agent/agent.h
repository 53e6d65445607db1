/* One host's agent: rendezvous with the other hosts over TLS, one device
 * thread per local device running a job (SPMD), clean shutdown or abort.
 * Jobs (training, benchmarks, self-tests) plug in as a function chosen by
 * the caller; the agent knows none of them. */
#ifndef MESHRUN_AGENT_H
#define MESHRUN_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "net/fault.h"
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
	/* a job that fails fills err and returns -errno */
	char err[512];
};

/* Runs on every device thread. Returns 0 or -errno (the classes: -EINVAL
 * config, -EBADMSG bad input, -EHOSTDOWN a peer lost, anything else a
 * failure); err explains. The first failure on any host aborts the job
 * everywhere and is what every agent_run returns. */
typedef int (*agent_job_fn)(struct device_ctx *dev);

/* A job that failed (rc, d->err) may say so before it tears down what
 * its sibling devices wait on, so its failure, not theirs, is the one
 * every host reports. The agent calls it too when the job returns rc. */
void agent_job_failed(struct device_ctx *d, int rc);

/* Blocks until every local device's job has returned on every host (or a
 * failure aborted the job). listen: where to accept links (NULL: from the
 * config). 0 or -errno (a job's, or -EHOSTDOWN a peer lost, -ECONNREFUSED
 * rendezvous refused, -EINVAL config) with the one-line reason in err. */
int agent_run(const struct cfg *cfg, int host_id, const char *listen, agent_job_fn job,
	      void *job_arg, char *err, size_t errlen);

/* The config's `faults` specs, parsed (net/fault.h). 0, or -EINVAL (a
 * config error naming the spec) with err. */
int agent_faults(const struct cfg *cfg, int num_hosts, struct fault_plan *p, char *err,
		 size_t errlen);

/* Bytes this host sent over DCN links so far (for step logs). */
uint64_t agent_dcn_bytes_sent(struct agent *a);
/* TLS sending keys this agent renewed on its links so far. */
uint64_t agent_tls_key_updates(struct agent *a);
/* What protects this host's links, in a phrase (net_link_security); ""
 * with no links. */
void agent_link_security(struct agent *a, char *buf, size_t len);
/* Links resumed after breaking, and frames sent again doing so. */
uint64_t agent_reconnects(struct agent *a);
uint64_t agent_frames_resent(struct agent *a);

#endif
