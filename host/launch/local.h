/* Single-machine launcher: makes throwaway certificates, picks a free
 * loopback port for the coordinator, starts one agent child process per
 * host, forwards SIGINT/SIGTERM to them, waits for all, reports each failed
 * exit, and kills the rest if one fails. Used by `meshrun local` and by every
 * benchmark that runs agents (`bench link`, `bench collectives`). */
#ifndef MESHRUN_LOCAL_H
#define MESHRUN_LOCAL_H

#include <stddef.h>

/* Starts `hosts` children, child i running
 *     <path of this binary> argv[0] ... argv[argc-1] --host-id I --hosts N
 *         certs_dir=<tmp> coordinator_address=127.0.0.1:<port>
 * with stdout/stderr inherited. Returns 0 if every child exited 0, else the
 * exit code of the first child that failed (an enum exit_code); err says
 * which host failed and how. The temporary certificate directory is removed. */
int local_launch(int hosts, int argc, char **argv, char *err, size_t errlen);

/* For subcommands that run as their own agents (`bench link`, `bench
 * collectives`): starts `hosts` children running
 *     cmd argv[0] --agent argv[1..] (without --hosts N / --hosts=N)
 * through local_launch. Same return as local_launch. */
int local_launch_agents(int hosts, const char *cmd, int argc, char **argv, char *err, size_t errlen);

/* Shared agent-side argument parsing for subcommands that run as agents:
 * consumes --config FILE, --host-id I, --hosts N, --devices-per-host D and
 * key=value overrides from argv; loads and finishes the config (mesh sizes
 * checked against N x D). Unknown --flags are left in argv (compacted) for
 * the caller: *argc is updated. 0 or an exit code with err filled. */
struct cfg;
int agent_args(int *argc, char **argv, struct cfg *c, int *host_id, char *err, size_t errlen);

#endif
