/* What the subcommands share: the mesh flags every agent takes, turning
 * them into a finished config, and starting agents on this machine. */
#ifndef MESHRUN_CMDS_H
#define MESHRUN_CMDS_H

#include <stddef.h>

#include "host/cli/args.h"

struct cfg;

/* --config FILE, --host-id I, --hosts N, --devices-per-host D. */
struct mesh_args {
	int host_id;          /* -1: not given */
	int hosts, devs;      /* 0: not given */
};
#define MESH_FLAGS 5
void cli_mesh_flags(struct arg_flag t[MESH_FLAGS], struct mesh_args *m);

/* The flags `meshrun agent` takes besides the mesh's (--job, --listen, the
 * run flags, ...): `local` accepts them too and passes them on. */
const struct arg_flag *cli_agent_flags(void);
/* The job those flags chose (--job NAME; "train" without it). */
const char *cli_agent_job(void);

/* Loads the config of an agent (files, overrides, a checkpoint's
 * config.json) and finishes it for the mesh m asks for (sizes left -1
 * without --hosts / --devices-per-host mean one). EXIT_OK, or EXIT_CONFIG
 * / EXIT_INPUT (the checkpoint's config.json) / EXIT_USAGE (host id out
 * of range) with err. */
int cli_agent_cfg(const struct args *a, const struct mesh_args *m, struct cfg *c, int *host_id,
		  char *err, size_t errlen);

/* What every agent of a training job would check in its config before
 * rendezvous, checked once by a launcher (local, launch) so a bad key or
 * fault spec is one line, not one per host: the config loaded and
 * finished for the mesh m asks for (m->hosts set), and train_check
 * (host/train/check.h: fault specs, axes, shapes, plans). EXIT_OK, or the
 * exit code with err; c holds the config. job is the agent job ("train";
 * another is not checked past its config). */
int cli_agent_check(const struct args *a, const struct mesh_args *m, const char *job,
		    struct cfg *c, char *err, size_t errlen);

/* The job's name for what it leaves behind (the checkpoint directory's
 * lock): MESHRUN_JOB_ID when a launcher set it ("local-4242", ssh
 * launch's "launch-<run id>"), else
 * "slurm-<SLURM_JOB_ID>" under Slurm, else "<cmd>-<this pid>". */
const char *cli_job_name(const char *cmd, char *buf, size_t len);

/* Starts `hosts` agents on loopback (host/launch/local.h), each running
 * this binary with prefix[0..nprefix-1] and then every argument of argv
 * except those taken by a flag named in the table `skip`; prints "<who>: <what failed>" and
 * returns the exit code: the first failed host's, EXIT_FAIL when one was
 * killed or nothing could start, EXIT_USAGE for a host count out of range. */
int cli_launch_local(const char *who, int hosts, const struct args *a, char **argv,
		     const struct arg_flag *skip, const char *const *prefix, int nprefix);

#endif
