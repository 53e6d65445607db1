/* `meshrun local`: N agents on this machine through the launcher's local
 * backend; and cli_launch_local, which the benchmarks use the same way. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/config/config.h"
#include "host/launch/local.h"

/* After one agent fails the others get the heartbeat timeout they run
 * with (best effort: a bad config is theirs to report) and a little more
 * to fail on their own. */
static double grace_s(const struct args *a)
{
	static struct cfg c;
	char err[256];
	args_load_cfg(a, &c, err, sizeof(err));
	return (c.heartbeat_timeout_s > 0 ? c.heartbeat_timeout_s : 10) + 3.0;
}

static int launch_exit_code(int rc, const struct launch_result *r)
{
	if (rc == -ECHILD)
		return r->first_code > 0 ? r->first_code : EXIT_FAIL;
	return cli_exit_code(rc);
}

int cli_launch_local(const char *who, int hosts, const struct args *a, char **argv,
		     const struct arg_flag *skip, const char *const *prefix, int nprefix)
{
	char err[1024] = "";
	struct launch_result r;
	if (hosts < 1 || hosts > LOCAL_MAX_HOSTS) {
		fprintf(stderr, "%s: --hosts must be in [1, %d], got %d\n", who, LOCAL_MAX_HOSTS, hosts);
		return EXIT_USAGE;
	}
	char **cargv = calloc((size_t)a->argc + (size_t)nprefix + 1, sizeof(char *));
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
	struct launch_opts o = { .grace_s = grace_s(a), .exit_name = cli_exit_name };
	int rc = local_launch(hosts, cargc, cargv, &o, &r, err, sizeof(err));
	free(cargv);
	if (rc)
		fprintf(stderr, "%s: %s\n", who, err[0] ? err : "interrupted");
	return launch_exit_code(rc, &r);
}

int cmd_local(int argc, char **argv)
{
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	int hosts = 0;
	const struct arg_flag own[] = {
		{ "--hosts", ARG_INT, &hosts, 1, 1000000, NULL },
		{ "--host-id", ARG_REFUSE, NULL, 0, 0, "--host-id is chosen by the launcher" },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { own, cli_agent_flags(), mesh, NULL };
	if (args_parse(&a, tables, argc, argv, err, sizeof(err))) {
		fprintf(stderr, "meshrun: local: %s\n", err);
		args_release(&a);
		return EXIT_USAGE;
	}
	if (!hosts) {
		fprintf(stderr, "usage: meshrun local --hosts N [--devices-per-host D] --config FILE [key=value ...]\n");
		args_release(&a);
		return EXIT_USAGE;
	}
	static const char *const prefix[] = { "agent" };
	int rc = cli_launch_local("meshrun: local", hosts, &a, argv, own, prefix, 1);
	args_release(&a);
	return rc;
}
