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

#include "host/ckpt/ckpt.h"
#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/config/config.h"
#include "host/launch/local.h"

/* After one agent fails the others get a moment to fail on their own (an
 * Abort or a closed link reaches them at once; a host that fell silent is
 * reported lost by its peers and killed by the launcher), then SIGTERM,
 * then SIGKILL: the job ends within heartbeat_timeout_s + 2 s of a host
 * falling silent. */
static const struct launch_opts local_opts = {
	.grace_s = 1.5, .term_grace_s = 0.5, .exit_name = cli_exit_name,
};

static int launch_exit_code(int rc, const struct launch_result *r)
{
	if (rc == -ECHILD && r->first_lost)
		return EXIT_PEER_LOST;
	if (rc == -ECHILD)
		return r->first_code > 0 ? r->first_code : EXIT_FAIL;
	return cli_exit_code(rc);
}

/* What a restart needs: the limit, the checkpoint directory, whether the
 * command already resumes, when the first launch started. */
struct restarts {
	int max;
	const char *ckpt_dir;
	bool resume;
	time_t t0;
};

/* A failure worth a restart: a host died, was lost or failed at run time;
 * not a usage, config, input or refusal error, which would repeat. */
static bool restartable(int rc, const struct launch_result *r)
{
	if (rc != -ECHILD || r->interrupted)
		return false;
	if (r->first_lost || r->first_code < 0)
		return true;
	return r->first_code == EXIT_FAIL || r->first_code == EXIT_PEER_LOST;
}

/* Whether restart `n` resumes: with the newest complete checkpoint (one
 * this command wrote, unless it resumed from the start), prints the line
 * for the restart and returns true. */
static bool restart_line(const char *who, const struct restarts *rs, int n, const char *why)
{
	char path[4096], err[256];
	int64_t step = -1;
	struct stat st;
	bool found = !ckpt_find(rs->ckpt_dir, path, sizeof(path), &step, err, sizeof(err)) &&
		     step >= 0 && !stat(path, &st) && (rs->resume || st.st_mtime >= rs->t0 - 1);
	if (found)
		fprintf(stderr, "%s: %s; restart %d of %d from checkpoint step %" PRId64 "\n", who, why,
			n, rs->max, step);
	else
		fprintf(stderr, "%s: %s; restart %d of %d from the start (no checkpoint yet)\n", who,
			why, n, rs->max);
	return found;
}

/* Launches, and relaunches with --resume after each restartable failure,
 * at most rs->max times. cargv has room for one more argument. */
static int launch_restarting(const char *who, int hosts, int cargc, char **cargv,
			     const struct restarts *rs)
{
	char err[1024] = "";
	struct launch_result r;
	int rc;
	bool resuming = rs->resume;
	for (int n = 1;; n++) {
		err[0] = 0;
		rc = local_launch(hosts, cargc, cargv, &local_opts, &r, err, sizeof(err));
		if (n > rs->max || !restartable(rc, &r))
			break;
		if (restart_line(who, rs, n, err) && !resuming) {
			cargv[cargc++] = "--resume";
			resuming = true;
		}
	}
	if (rc)
		fprintf(stderr, "%s: %s\n", who, err[0] ? err : "interrupted");
	return launch_exit_code(rc, &r);
}

static int launch_local(const char *who, int hosts, const struct args *a, char **argv,
			const struct arg_flag *skip, const char *const *prefix, int nprefix,
			const struct restarts *rs)
{
	if (hosts < 1 || hosts > LOCAL_MAX_HOSTS) {
		fprintf(stderr, "%s: --hosts must be in [1, %d], got %d\n", who, LOCAL_MAX_HOSTS, hosts);
		return EXIT_USAGE;
	}
	char **cargv = calloc((size_t)a->argc + (size_t)nprefix + 2, sizeof(char *));
	if (!cargv) {
		fprintf(stderr, "%s: out of memory\n", who);
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
	int rc = launch_restarting(who, hosts, cargc, cargv, rs);
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
 * (usage) and checkpoint_period > 0 (config). EXIT_OK or the exit code,
 * with the message printed. */
static int check_restarts(const struct args *a, const struct restarts *rs)
{
	static struct cfg c;
	char err[640];
	if (!rs->max)
		return EXIT_OK;
	if (!rs->ckpt_dir) {
		fprintf(stderr, "meshrun: local: --max-restarts needs --checkpoint-dir DIR\n");
		return EXIT_USAGE;
	}
	if (args_load_cfg(a, &c, err, sizeof(err))) {
		fprintf(stderr, "meshrun: local: %s\n", err);
		return EXIT_CONFIG;
	}
	if (c.checkpoint_period <= 0) {
		fprintf(stderr, "meshrun: local: config: --max-restarts needs checkpoint_period > 0 "
			"(got %" PRId64 ")\n", (int64_t)c.checkpoint_period);
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
	if (args_parse(&a, tables, argc, argv, err, sizeof(err))) {
		fprintf(stderr, "meshrun: local: %s\n", err);
		args_release(&a);
		return EXIT_USAGE;
	}
	if (!hosts) {
		fprintf(stderr, "usage: meshrun local --hosts N [--devices-per-host D] [--max-restarts K] --config FILE [key=value ...]\n");
		args_release(&a);
		return EXIT_USAGE;
	}
	int rc = check_restarts(&a, &rs);
	if (rc) {
		args_release(&a);
		return rc;
	}
	static const char *const prefix[] = { "agent" };
	rc = launch_local("meshrun: local", hosts, &a, argv, own, prefix, 1, &rs);
	args_release(&a);
	return rc;
}
