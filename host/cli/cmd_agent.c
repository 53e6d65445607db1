/* `meshrun agent`: one host of a run. The CLI chooses the job (training or
 * the pingpong self-test); the agent runs it. Also the mesh flags and
 * config loading every agent-running command shares. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/agent/agent.h"
#include "host/agent/pingpong.h"
#include "host/ckpt/hf_load.h"
#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/config/config.h"
#include "host/launch/launch.h"
#include "host/train/check.h"
#include "host/train/loop.h"
#include "host/train/preflight.h"
#include "host/train/train_job.h"
#include "host/util/threads.h"

void cli_mesh_flags(struct arg_flag t[MESH_FLAGS], struct mesh_args *m)
{
	t[0] = (struct arg_flag){ "--config", ARG_CONFIG, NULL, 0, 0, NULL };
	t[1] = (struct arg_flag){ "--host-id", ARG_INT, &m->host_id, 0, 1000000, NULL };
	t[2] = (struct arg_flag){ "--hosts", ARG_INT, &m->hosts, 1, 1000000, NULL };
	t[3] = (struct arg_flag){ "--devices-per-host", ARG_INT, &m->devs, 1, 1000000, NULL };
	t[4] = (struct arg_flag){ NULL, 0, NULL, 0, 0, NULL };
}

/* Is any axis of the family left to fill in (-1)? */
static bool any_fill(const struct cfg *c, bool dcn)
{
	for (int a = 0; a < AX_COUNT; a++)
		if (cfg_axis_key(c, dcn, a) == -1)
			return true;
	return false;
}

int cli_agent_cfg(const struct args *a, const struct mesh_args *m, struct cfg *c, int *host_id,
		  char *err, size_t errlen)
{
	int hosts = m->hosts, devs = m->devs, hid = m->host_id;
	int rc = args_load_cfg(a, c, err, errlen);
	if (rc)
		return cli_exit_code(rc);
	/* without --hosts / --devices-per-host a -1 size means one */
	if (!hosts && any_fill(c, true))
		hosts = c->hosts.n ? c->hosts.n : 1;
	if (!devs && any_fill(c, false))
		devs = 1;
	if (cfg_finish(c, hosts, devs, err, errlen))
		return EXIT_CONFIG;
	if (hid < 0)
		hid = 0;
	if (hid >= c->num_hosts) {
		snprintf(err, errlen, "--host-id %d is out of range: the mesh has %d hosts (0..%d)",
			 hid, c->num_hosts, c->num_hosts - 1);
		return EXIT_USAGE;
	}
	*host_id = hid;
	return EXIT_OK;
}

const char *cli_job_name(const char *cmd, char *buf, size_t len)
{
	const char *id = getenv("MESHRUN_JOB_ID"), *slurm = getenv("SLURM_JOB_ID");
	if (id && *id)
		snprintf(buf, len, "%.100s", id);
	else if (slurm && *slurm)
		snprintf(buf, len, "slurm-%.90s", slurm);
	else
		snprintf(buf, len, "%s-%ld", cmd, (long)getpid());
	return buf;
}

int cli_agent_check(const struct args *a, const struct mesh_args *m, const char *job,
		    struct cfg *c, char *err, size_t errlen)
{
	struct mesh mesh;
	int host_id, rc = cli_agent_cfg(a, m, c, &host_id, err, errlen);
	if (rc || (job && strcmp(job, "train")))
		return rc;
	mesh_init(&mesh, c);
	if ((rc = train_check(c, &mesh, err, errlen)))
		cfg_error_origins(c, err, errlen);
	return cli_exit_code(rc);
}

/* ---- `meshrun agent` ---- */

/* An integer from the first of two environment variables that is set:
 * 0 and *v, 1 when neither is set, -1 (err) when the value is not an
 * integer in [lo, hi]. */
static int env_int(const char *a, const char *b, long lo, long hi, int *v, char *err, size_t errlen)
{
	const char *name = getenv(a) ? a : b;
	const char *s = getenv(name);
	char *end;
	if (!s)
		return 1;
	errno = 0;
	long x = strtol(s, &end, 10);
	if (!*s || *end || errno || x < lo || x > hi) {
		snprintf(err, errlen, "%s='%s' is not an integer in [%ld, %ld]", name, s, lo, hi);
		return -1;
	}
	*v = (int)x;
	return 0;
}

/* Identity from the environment when the flags do not give it: the host
 * id from MESHRUN_HOST_ID, else SLURM_NODEID; the host count from
 * MESHRUN_NUM_HOSTS, else SLURM_NNODES (each node of a Slurm step reads
 * its own). 0, or -1 with err. */
static int env_identity(struct mesh_args *m, char *err, size_t errlen)
{
	if (m->host_id < 0 &&
	    env_int("MESHRUN_HOST_ID", "SLURM_NODEID", 0, 1000000, &m->host_id, err, errlen) < 0)
		return -1;
	if (!m->hosts &&
	    env_int("MESHRUN_NUM_HOSTS", "SLURM_NNODES", 1, 1000000, &m->hosts, err, errlen) < 0)
		return -1;
	return 0;
}

/* MESHRUN_COORDINATOR (host:port, or a host that keeps the config's
 * port) replaces coordinator_address. 0, or -1 with err. */
static int env_coordinator(struct cfg *c, char *err, size_t errlen)
{
	const char *v = getenv("MESHRUN_COORDINATOR");
	char host[CFG_STR];
	const char *colon;
	if (!v || !*v)
		return 0;
	colon = strrchr(v, ':');
	if (colon && colon[1] && !strchr(v, ']') && strchr(v, ':') == colon) {
		snprintf(c->coordinator_address, sizeof(c->coordinator_address), "%s", v);
		return 0;
	}
	colon = strrchr(c->coordinator_address, ':');
	if (!colon || snprintf(host, sizeof(host), "%s%s", v, colon) >= (int)sizeof(host)) {
		snprintf(err, errlen, "MESHRUN_COORDINATOR='%.200s' wants host:port", v);
		return -1;
	}
	memcpy(c->coordinator_address, host, sizeof(host));
	return 0;
}

struct agent_cli {
	const char *listen, *job;
	struct pingpong_arg pp;
	struct train_opts run;
};

static struct agent_cli ao;

static const struct arg_flag agent_flags[] = {
	{ "--listen", ARG_STR, &ao.listen, 0, 0, NULL },
	{ "--job", ARG_STR, &ao.job, 0, 0, NULL },
	{ "--size", ARG_BYTES, &ao.pp.size, 0, 1ull << 40, NULL },
	{ "--rounds", ARG_LONG, &ao.pp.rounds, 0, 2e9, NULL },
	{ "--hold-s", ARG_DOUBLE, &ao.pp.hold_s, 0, 3600, NULL },
	{ "--metrics", ARG_STR, &ao.run.metrics, 0, 0, NULL },
	{ "--checkpoint-dir", ARG_STR, &ao.run.ckpt_dir, 0, 0, NULL },
	{ "--trace", ARG_STR, &ao.run.trace, 0, 0, NULL },
	{ "--resume", ARG_BOOL, &ao.run.resume, 0, 0, NULL },
	{ "--fault", ARG_APPEND, NULL, 0, 0, "faults" },
	{ "--quiet", ARG_BOOL, &ao.run.quiet, 0, 0, NULL },
	/* launchers only: which restart of the job this agent is */
	{ LAUNCH_RESTART_FLAG, ARG_INT, &ao.run.restart, 0, 1000000, NULL },
	{ NULL, 0, NULL, 0, 0, NULL },
};

const struct arg_flag *cli_agent_flags(void)
{
	return agent_flags;
}

const char *cli_agent_job(void)
{
	return ao.job ? ao.job : "train";
}

struct job_entry {
	const char *name;
	agent_job_fn fn;
};

static const struct job_entry jobs[] = {
	{ "train", train_job },
	{ "pingpong", pingpong_job },
	{ NULL, NULL },
};

int cmd_agent(int argc, char **argv)
{
	static struct cfg cfg;
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	int host_id = -1, rc;

	ao = (struct agent_cli){ .job = "train", .pp = { .size = 1 << 20, .rounds = 10 } };
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { agent_flags, mesh, NULL };
	if (args_parse(&a, tables, argc, argv, err, sizeof(err)) ||
	    env_identity(&m, err, sizeof(err))) {
		args_release(&a);
		return cli_usage_error("agent", "%s", err);
	}
	const struct job_entry *j = jobs;
	while (j->name && strcmp(j->name, ao.job))
		j++;
	bool train = j->fn == train_job;
	if (train && ao.run.resume && !ao.run.ckpt_dir) {
		args_release(&a);
		return cli_usage_error("agent", "--resume needs --checkpoint-dir DIR");
	}
	rc = cli_agent_cfg(&a, &m, &cfg, &host_id, err, sizeof(err));
	args_release(&a);
	if (!rc && env_coordinator(&cfg, err, sizeof(err)))
		rc = EXIT_USAGE;
	if (rc) {
		cli_error("agent", "%s", err);
		return rc;
	}
	if (!j->name)
		return cli_usage_error("agent", "unknown job '%s' (this build has: train, pingpong)",
				       ao.job);
	/* the host that writes the outputs proves it can, before rendezvous */
	struct train_outputs out = { .lock.fd = -1 };
	char job[128], who[32];
	snprintf(who, sizeof(who), "host %d", host_id);
	if (train && host_id == 0 &&
	    (rc = train_preflight(&out, &cfg, &ao.run, cli_job_name("agent", job, sizeof(job)), err,
				  sizeof(err)))) {
		cfg_error_origins(&cfg, err, sizeof(err));
		cli_error(who, "%s", err);
		return cli_exit_code(rc);
	}
	if (train)
		util_blas_threads(&cfg, cfg.devices_per_host * util_agents_on_machine());
	/* the weights to start from: every header checked before anything
	 * else starts; each device then reads its own shards */
	if (train && !ao.run.resume && cfg.load_parameters_path[0] &&
	    (rc = hf_src_open(&ao.run.weights, cfg.load_parameters_path, cfg.devices_per_host, err,
			      sizeof(err)))) {
		cli_error(who, "%s", err);
		train_outputs_release(&out);
		return cli_exit_code(rc);
	}
	/* --resume: every host that sees the checkpoint reads its own part;
	 * one that does not (host 0's disk alone) is sent it by host 0 */
	if (train && ao.run.resume &&
	    (rc = ckpt_resume_open(&ao.run.resume_from, ao.run.ckpt_dir, cfg.devices_per_host, err,
				   sizeof(err)))) {
		if (host_id == 0) {
			cli_error(who, "%s", err);
			train_outputs_release(&out);
			return cli_exit_code(rc);
		}
		fprintf(stderr, "meshrun: %s: resume: this host cannot read the checkpoint (%s): host 0 "
			"sends it\n", who, err);
	}
	rc = agent_run(&cfg, host_id, ao.listen, j->fn, train ? (void *)&ao.run : (void *)&ao.pp, err,
		       sizeof(err));
	if (rc)   /* the job's train_check, say: where a key came from */
		cfg_error_origins(&cfg, err, sizeof(err));
	hf_src_close(ao.run.weights);
	ckpt_resume_close(ao.run.resume_from);
	train_outputs_release(&out);
	if (rc)
		cli_error(who, "%s", err);
	return cli_exit_code(rc);
}
