/* The one mapping from library results (0 / -errno) to exit codes. */
#include <errno.h>

#include "host/cli/cli.h"
#include "host/launch/launch.h"

int cli_exit_code(int rc)
{
	switch (rc) {
	case 0: return EXIT_OK;
	case -EINVAL: return EXIT_CONFIG;
	case -EBADMSG: return EXIT_INPUT;
	case -ENOMEM: return EXIT_FAIL;  /* out of memory: a failure, never a config error */
	case -EHOSTDOWN: return EXIT_PEER_LOST;
	case -ECONNREFUSED: return EXIT_REFUSED;
	case -EKEYREJECTED: return EXIT_TLS;
	default: return EXIT_FAIL;
	}
}

const char *cli_exit_name(int code)
{
	switch (code) {
	case EXIT_OK: return "ok";
	case EXIT_FAIL: return "failed";
	case EXIT_USAGE: return "usage error";
	case EXIT_CONFIG: return "config error";
	case EXIT_INPUT: return "bad input";
	case EXIT_PEER_LOST: return "peer lost";
	case EXIT_REFUSED: return "refused";
	case EXIT_TLS: return "tls failure";
	case EXIT_INTERRUPTED: return "interrupted";
	default: return "failed";
	}
}

int cli_launch_exit_code(int rc, const struct launch_result *r)
{
	if (r->interrupted)
		return EXIT_INTERRUPTED;
	if (rc == -ECHILD && r->first_lost)
		return EXIT_PEER_LOST;
	if (rc == -ECHILD)
		return r->first_code > 0 ? r->first_code : EXIT_FAIL;
	return cli_exit_code(rc);
}

bool cli_restart_code(int code)
{
	return code == EXIT_FAIL || code == EXIT_PEER_LOST;
}
