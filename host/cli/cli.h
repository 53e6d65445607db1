/* Subcommands of build/meshrun. Each returns the process exit code
 * (enum exit_code); argv[0] is the subcommand name. Below the CLI every
 * layer returns 0 or a negative errno; cli_exit_code is the one place that
 * turns those into exit codes. */
#ifndef MESHRUN_CLI_H
#define MESHRUN_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Exit codes distinguish what went wrong. */
enum exit_code {
	EXIT_OK = 0,
	EXIT_FAIL = 1,        /* generic runtime failure */
	EXIT_USAGE = 2,       /* bad command line */
	EXIT_CONFIG = 3,      /* config error */
	EXIT_INPUT = 4,       /* bad input file (data, checkpoint) */
	EXIT_PEER_LOST = 5,   /* a peer host died or fell silent */
	EXIT_REFUSED = 6,     /* rendezvous refused (mismatch, duplicate id) */
	EXIT_TLS = 7,         /* a TLS handshake failed: a certificate, or not TLS there */
	EXIT_INTERRUPTED = 130, /* Ctrl-C (SIGINT) or SIGTERM: 128 + SIGINT, as shells say */
};

/* ---- the one voice (host/cli/usage.c) ---- */

/* A command's usage text ("train --config FILE ...\n", one or more
 * lines), or NULL for a name that is not a command. */
const char *cli_usage(const char *cmd);
/* "usage: meshrun <usage>" on f. */
void cli_print_usage(FILE *f, const char *cmd);
/* One error line on stderr, "meshrun: WHO: <text>": every command's
 * errors start alike (an agent's run-time ones say "host I" as WHO). */
void cli_error(const char *who, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A bad command line: the error line, then the command's usage; returns
 * EXIT_USAGE. cmd may name a subcommand ("bench link"). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The exit code for a library result: 0 -> EXIT_OK, -EINVAL -> config,
 * -EBADMSG -> bad input, -EHOSTDOWN -> peer lost, -ECONNREFUSED ->
 * refused, -EKEYREJECTED -> tls, anything else -> EXIT_FAIL. The table
 * in docs/conventions.md says the same (tests/check_args.c reads it). */
int cli_exit_code(int rc);
/* A few words for an exit code ("config error"), for launch reports. */
const char *cli_exit_name(int code);

struct launch_result;
/* A launcher's exit code (local, launch): an interrupt (Ctrl-C) is
 * EXIT_INTERRUPTED, a lost host EXIT_PEER_LOST, a child's failure its
 * exit code (EXIT_FAIL if a signal ended it), anything else
 * cli_exit_code(rc). */
int cli_launch_exit_code(int rc, const struct launch_result *r);
/* An agent's exit code worth a restart (host/launch/launch.h
 * launch_restarts.retry_code): a run-time failure or a lost peer. */
bool cli_restart_code(int code);

int cmd_agent(int argc, char **argv);
int cmd_local(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_shardings(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_schedule(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_plan(int argc, char **argv);

#endif
