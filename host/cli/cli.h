/* Subcommands of build/meshrun. Each returns the process exit code
 * (see enum exit_code); argv[0] is the subcommand name. */
#ifndef MESHRUN_CLI_H
#define MESHRUN_CLI_H

/* Exit codes distinguish what went wrong (DESIGN §10). */
enum exit_code {
	EXIT_OK = 0,
	EXIT_FAIL = 1,        /* generic runtime failure */
	EXIT_USAGE = 2,       /* bad command line */
	EXIT_CONFIG = 3,      /* config error */
	EXIT_INPUT = 4,       /* bad input file (data, checkpoint) */
	EXIT_PEER_LOST = 5,   /* a peer host died or fell silent */
	EXIT_REFUSED = 6,     /* rendezvous refused (mismatch, duplicate id) */
};

int cmd_agent(int argc, char **argv);
int cmd_local(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_shardings(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_schedule(int argc, char **argv);

#endif
