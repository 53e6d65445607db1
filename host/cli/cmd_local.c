/* `meshrun local`: N agents on this machine through the launcher's local
 * backend, restarted from the newest checkpoint after a failure when
 * --max-restarts allows; and cli_launch_local, which the benchmarks use
 * the same way. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/ckpt/ckpt.h"
#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/config/config.h"
#include "host/launch/local.h"
#include "host/train/preflight.h"

/* After one agent fails the others get a moment to fail on their own (an
 * Abort or a closed link reaches them at once; a host that fell silent is
 * reported lost by its peers and killed by the launcher), then SIGTERM,
 * then SIGKILL: the job ends within heartbeat_timeout_s + 2 s of a host
 * falling silent. */
static const struct launch_opts local_opts = {
	.grace_s = 1.5, .term_grace_s = 0.5, .exit_name = cli_exit_name,
};

/* What a restart needs: the limit, the checkpoint directory, whether the
 * command already resumes, when the first launch started. */
struct restarts {
	int max;
	const char *ckpt_dir;
	bool resume;
	time_t t0;
};

/* One local launch for launch_restarting: the agents' arguments, then
 * what this launch adds (cargv has room for three more). */
struct local_run {
	int hosts, cargc;
	char **cargv;
	const struct restarts *rs;
};

static int local_once(void *ctx, int restart, bool resume, struct launch_result *r, char *err,
		      size_t errlen)
{
	struct local_run *lr = ctx;
	char num[16];
	int n = lr->cargc;
	if (resume && !lr->rs->resume)
		lr->cargv[n++] = "--resume";
	if (restart > 0) {
		snprintf(num, sizeof(num), "%d", restart);
		lr->cargv[n++] = LAUNCH_RESTART_FLAG;
		lr->cargv[n++] = num;
	}
	lr->cargv[n] = NULL;
	return local_launch(lr->hosts, n, lr->cargv, &local_opts, r, err, errlen);
}

/* The newest complete checkpoint: one this command wrote, unless it
 * resumed from the start (then any). */
static int64_t local_checkpoint(void *ctx)
{
	const struct restarts *rs = ((struct local_run *)ctx)->rs;
	char path[4096], err[256];
	int64_t step = -1;
	struct stat st;
	if (!ckpt_find(rs->ckpt_dir, path, sizeof(path), &step, err, sizeof(err)) && step >= 0 &&
	    !stat(path, &st) && (rs->resume || st.st_mtime >= rs->t0 - 1))
		return step;
	return -1;
}

/* Launches, and relaunches with --resume and --restart N after each
 * restartable failure, at most rs->max times. cargv has room for three
 * more arguments. */
static int launch_restarting_local(const char *who, int hosts, int cargc, char **cargv,
				   const struct restarts *rs)
{
	char err[1024] = "";
	struct launch_result r;
	struct local_run lr = { .hosts = hosts, .cargc = cargc, .cargv = cargv, .rs = rs };
	const struct launch_restarts lrs = {
		.max = rs->max, .resume = rs->resume, .launch = local_once,
		.checkpoint = local_checkpoint, .retry_code = cli_restart_code, .ctx = &lr,
	};
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "meshrun: %s", who);
	int rc = launch_restarting(prefix, &lrs, &r, err, sizeof(err));
	if (r.interrupted)
		cli_error(who, "interrupted; every agent stopped");
	else if (rc)
		cli_error(who, "%s", err[0] ? err : "failed");
	return cli_launch_exit_code(rc, &r);
}

static int launch_local(const char *who, int hosts, const struct args *a, char **argv,
			const struct arg_flag *skip, const char *const *prefix, int nprefix,
			const struct restarts *rs)
{
	if (hosts < 1 || hosts > LOCAL_MAX_HOSTS)
		return cli_usage_error(who, "--hosts must be in [1, %d], got %d", LOCAL_MAX_HOSTS, hosts);
	char **cargv = calloc((size_t)a->argc + (size_t)nprefix + 4, sizeof(char *));
	if (!cargv) {
		cli_error(who, "out of memory");
		return EXIT_FAIL;
	}
	int cargc = 0;
	for (int i = 0; i < nprefix; i++)
		cargv[cargc++] = (char *)prefix[i];
	for (int i = 1; i < a->argc; i++) {
		const struct arg_flag *f = a->owner[i];
		bool skipped = false;
		for (const struct arg_flag *s = skip; f && s && s->name; s++)
			skipped |= !strcmp(f->name, s->name);
		if (!skipped)
			cargv[cargc++] = argv[i];
	}
	int rc = launch_restarting_local(who, hosts, cargc, cargv, rs);
	free(cargv);
	return rc;
}

int cli_launch_local(const char *who, int hosts, const struct args *a, char **argv,
		     const struct arg_flag *skip, const char *const *prefix, int nprefix)
{
	const struct restarts none = { 0 };
	return launch_local(who, hosts, a, argv, skip, prefix, nprefix, &none);
}

/* --max-restarts needs checkpoints to restart from: --checkpoint-dir
 * (usage) and checkpoint_period > 0 (config, c). EXIT_OK or the exit
 * code, with the message printed. */
static int check_restarts(const struct cfg *c, const struct restarts *rs)
{
	if (!rs->max)
		return EXIT_OK;
	if (!rs->ckpt_dir)
		return cli_usage_error("local", "--max-restarts needs --checkpoint-dir DIR");
	if (c->checkpoint_period <= 0) {
		cli_error("local", "config: --max-restarts needs checkpoint_period > 0 (got %" PRId64 ")",
			  (int64_t)c->checkpoint_period);
		return EXIT_CONFIG;
	}
	return EXIT_OK;
}

int cmd_local(int argc, char **argv)
{
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	int hosts = 0;
	struct restarts rs = { .t0 = time(NULL) };
	const struct arg_flag own[] = {
		{ "--hosts", ARG_INT, &hosts, 1, 1000000, NULL },
		{ "--host-id", ARG_REFUSE, NULL, 0, 0, "--host-id is chosen by the launcher" },
		{ LAUNCH_RESTART_FLAG, ARG_REFUSE, NULL, 0, 0, "--restart is set by the launcher" },
		{ "--max-restarts", ARG_INT, &rs.max, 0, 1000000, NULL },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	/* read here and passed on to the agents as well */
	const struct arg_flag peek[] = {
		{ "--checkpoint-dir", ARG_STR, &rs.ckpt_dir, 0, 0, NULL },
		{ "--resume", ARG_BOOL, &rs.resume, 0, 0, NULL },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { own, peek, cli_agent_flags(), mesh, NULL };
	if (args_parse(&a, tables, argc, argv, err, sizeof(err)) || !hosts) {
		args_release(&a);
		return cli_usage_error("local", "%s", hosts ? err : "--hosts N is needed");
	}
	/* a bad config is said once, here, not by every agent */
	static struct cfg c;
	m.hosts = hosts;
	int rc = cli_agent_check(&a, &m, cli_agent_job(), &c, err, sizeof(err));
	if (rc) {
		args_release(&a);
		cli_error("local", "%s", err);
		return rc;
	}
	local_set_cpu_bind(c.cpu_bind, c.devices_per_host);
	rc = check_restarts(&c, &rs);
	/* a checkpoint that cannot continue this run, said once, nothing started */
	if (!rc && rs.resume && rs.ckpt_dir && !strcmp(cli_agent_job(), "train") &&
	    (rc = cli_exit_code(train_resume_fits(&c, rs.ckpt_dir, err, sizeof(err)))))
		cli_error("local", "%s", err);
	if (rc) {
		args_release(&a);
		return rc;
	}
	/* the agents name the job by the launcher (host/cli/cmds.h) */
	char job[64];
	snprintf(job, sizeof(job), "local-%ld", (long)getpid());
	if (!getenv("MESHRUN_JOB_ID"))
		setenv("MESHRUN_JOB_ID", job, 1);
	static const char *const prefix[] = { "agent" };
	rc = launch_local("local", hosts, &a, argv, own, prefix, 1, &rs);
	args_release(&a);
	return rc;
}
