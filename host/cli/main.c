/* meshrun: one binary, several subcommands (see README). Each command
 * lives in host/cli/cmd_*.c and registers one line here. */
#include <stdio.h>
#include <string.h>

#include "host/cli/cli.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *usage;
};

static const struct command commands[] = {
	/* each subcommand registers one line here */
	{ "train", cmd_train, "train --config FILE [key=value ...] [--metrics FILE] [--checkpoint-dir DIR] [--resume]" },
	{ "bench", cmd_bench, "bench matmul | link | collectives ... (see meshrun bench)" },
	{ "eval", cmd_eval, "eval --checkpoint DIR --text FILE [key=value ...]" },
	{ "agent", cmd_agent, "agent --config FILE --host-id I [--hosts N] [--devices-per-host D] [--listen ADDR] [--job NAME] [key=value ...]" },
	{ "local", cmd_local, "local --hosts N [--devices-per-host D] --config FILE [key=value ...]" },
	{ "launch", cmd_launch, "launch --hostfile FILE [--ssh-config FILE] [--devices-per-host D] --config FILE [key=value ...] [--metrics FILE] [--keep] [--quiet]" },
	{ "shardings", cmd_shardings, "shardings --config FILE [--hosts N] [--devices-per-host D] [key=value ...]" },
	{ "report", cmd_report, "report METRICS.jsonl [--trace TRACE.json] -o FILE.svg" },
	{ "schedule", cmd_schedule, "schedule --config FILE [--costs F:I:W|measured] [key=value ...]" },
	{ "plan", cmd_plan, "plan --config FILE [--hosts N] [--devices-per-host D] [--link-gbps G] [--flops F] [--cores C] [--search] [key=value ...]" },
	{ NULL, NULL, NULL },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: meshrun COMMAND [args]\n");
	for (const struct command *c = commands; c->name; c++)
		fprintf(f, "  %s\n", c->usage);
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : EXIT_OK;
	}
	for (const struct command *c = commands; c->name; c++)
		if (!strcmp(argv[1], c->name))
			return c->fn(argc - 1, argv + 1);
	fprintf(stderr, "meshrun: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return EXIT_USAGE;
}
