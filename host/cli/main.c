/* meshrun: one binary, several subcommands (see README). Each command
 * lives in host/cli/cmd_*.c, registers one line here and its usage in
 * host/cli/usage.c. `meshrun CMD --help` (or -h, anywhere among CMD's
 * arguments) prints CMD's usage and exits 0, for every command. */
#include <stdio.h>
#include <string.h>

#include "host/cli/cli.h"
#include "host/util/threads.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
};

static const struct command commands[] = {
	/* each subcommand registers one line here */
	{ "train", cmd_train },
	{ "bench", cmd_bench },
	{ "eval", cmd_eval },
	{ "agent", cmd_agent },
	{ "local", cmd_local },
	{ "launch", cmd_launch },
	{ "shardings", cmd_shardings },
	{ "report", cmd_report },
	{ "schedule", cmd_schedule },
	{ "data", cmd_data },
	{ "plan", cmd_plan },
	{ NULL, NULL },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: meshrun COMMAND [args]   (meshrun COMMAND --help: one command's)\n");
	for (const struct command *c = commands; c->name; c++)
		fprintf(f, "  %s", cli_usage(c->name));
}

/* --help or -h among a command's arguments (the hidden `launch
 * --ssh-child` carries a remote command line: not its to read) */
static bool wants_help(int argc, char **argv)
{
	if (argc > 2 && !strcmp(argv[2], "--ssh-child"))
		return false;
	for (int i = 2; i < argc; i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return true;
	return false;
}

int main(int argc, char **argv)
{
	char err[160];
	util_blas_kernels(argv);	/* may re-execute: before anything else */
	if (util_kernel_isa(err, sizeof err)) {
		fprintf(stderr, "meshrun: %s\n", err);
		return EXIT_USAGE;
	}
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : EXIT_OK;
	}
	for (const struct command *c = commands; c->name; c++) {
		if (strcmp(argv[1], c->name))
			continue;
		if (wants_help(argc, argv)) {
			cli_print_usage(stdout, c->name);
			return EXIT_OK;
		}
		return c->fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "meshrun: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return EXIT_USAGE;
}
