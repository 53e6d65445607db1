/* `meshrun shardings`: the command; host/mesh/shardings.c describes. */
#include <errno.h>
#include <stdio.h>

#include "host/cli/args.h"
#include "host/cli/cli.h"
#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shardings.h"

int cmd_shardings(int argc, char **argv)
{
	static struct cfg c;
	int hosts = 0, devs = 0;
	struct args a;
	char err[1024];
	const struct arg_flag flags[] = {
		{ "--config", ARG_CONFIG, NULL, 0, 0, NULL },
		{ "--hosts", ARG_INT, &hosts, 1, MESH_MAX_DEVICES, NULL },
		{ "--devices-per-host", ARG_INT, &devs, 1, MESH_MAX_DEVICES, NULL },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	const struct arg_flag *const tables[] = { flags, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc || !a.nconfigs) {
		args_release(&a);
		return cli_usage_error("shardings", "%s", rc ? err : "--config FILE is needed");
	}
	rc = args_load_cfg(&a, &c, err, sizeof(err));
	args_release(&a);
	if (!rc)
		rc = shardings_describe(&c, hosts, devs, err, sizeof(err));
	if (rc)
		cli_error("shardings", "%s", err);
	return cli_exit_code(rc);
}
