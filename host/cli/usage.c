/* The one voice of the command line (host/cli/cli.h): every command's
 * usage text, printed for --help and after a bad command line, and the
 * one error prefix, "meshrun: <command>: ". main.c dispatches; the
 * commands print through here. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "host/cli/cli.h"

static const struct {
	const char *name, *usage;
} usages[] = {
	{ "train", "train --config FILE [key=value ...] [--metrics FILE] [--checkpoint-dir DIR] "
		   "[--resume] [--quiet]\n" },
	{ "eval", "eval --checkpoint DIR [--text FILE] [key=value ...]\n" },
	{ "local", "local --hosts N [--devices-per-host D] [--max-restarts K] --config FILE "
		   "[key=value ...] [--metrics FILE] [--checkpoint-dir DIR] [--resume] [--trace FILE] "
		   "[--fault SPEC ...] [--job NAME] [--quiet]\n" },
	{ "agent", "agent --config FILE --host-id I [--hosts N] [--devices-per-host D] "
		   "[--listen ADDR] [--job NAME] [key=value ...] [--metrics FILE] [--checkpoint-dir DIR] "
		   "[--resume] [--trace FILE] [--fault SPEC ...] [--quiet] "
		   "[--restart N (set by launchers only)]\n" },
	{ "launch", "launch --hostfile FILE [--ssh-config FILE] [--devices-per-host D] --config FILE "
		    "[key=value ...] [--metrics FILE] [--trace FILE] [--checkpoint-dir DIR] [--resume] "
		    "[--max-restarts K] [--certs DIR] [--log-dir DIR] [--keep] [--quiet] "
		    "[--fault SPEC ...]\n"
		    "       meshrun launch --slurm [--devices-per-host D] --config FILE [key=value ...] "
		    "[--metrics FILE] [--trace FILE] [--checkpoint-dir DIR] [--resume] [--max-restarts K] "
		    "[--certs DIR] [--quiet] [--fault SPEC ...]\n" },
	{ "shardings", "shardings --config FILE [--hosts N] [--devices-per-host D] [key=value ...]\n" },
	{ "report", "report METRICS.jsonl [--trace TRACE.json] -o FILE.svg\n" },
	{ "schedule", "schedule --config FILE [--costs F:I:W|measured] [key=value ...]\n" },
	{ "plan", "plan --config FILE [--hosts N] [--devices-per-host D] [--link-gbps G] "
		  "[--link-latency-us U] [--ici-gbps G] [--ici-latency-us U] [--flops F] [--cores C|auto] "
		  "[--threads T] [--iw I,W] [--costs-from TRACE [--costs-by kind|action|wall]] [--search] [--top K] [--mem-gb G] [key=value ...]\n" },
	{ "data", "data pack --format llmc|megatron [--input text|raw|llmc|megatron] "
		  "[--input-token-bytes 2|4] [--token-bytes 2|4] [--shard-tokens N] [--eot ID] [--name NAME] "
		  "INPUT... -o DIR\n"
		  "       meshrun data check --config FILE [key=value ...]\n" },
	{ "bench", "bench matmul [--threads N] [--size N] [--reps N]\n"
		   "       meshrun bench cipher [--bytes N] [--ms MS]\n"
		   "       meshrun bench link --hosts 2 --sizes 16M[,64K ...] [--iters K] [--oneway | --pingpong]\n"
		   "       meshrun bench collectives --hosts N [--devices-per-host D] --op OP "
		   "--sizes 64K,1M,16M [--iters K] [--warmup W] [--barrier] [--async] [--direct-max B] [key=value ...]\n"
		   "       meshrun bench collectives --hosts N [--devices-per-host D] --check-counts 0,1,1000[,...] "
		   "[--check-bits] [--check-lists] [key=value ...]\n"
		   "       meshrun bench load [--hosts N] [--host-id I] [--devices-per-host D] "
		   "load_parameters_path=DIR [key=value ...]\n"
		   "       meshrun bench backward --config FILE [--rows N] [--rounds K] [key=value ...]\n" },
};

const char *cli_usage(const char *cmd)
{
	for (size_t i = 0; i < sizeof(usages) / sizeof(usages[0]); i++)
		if (!strcmp(usages[i].name, cmd))
			return usages[i].usage;
	return NULL;
}

void cli_print_usage(FILE *f, const char *cmd)
{
	const char *u = cli_usage(cmd);
	if (u)
		fprintf(f, "usage: meshrun %s", u);
}

/* One write per line: agents started by `meshrun local` share the
 * launcher's stderr, and a line written in pieces can interleave with
 * another agent's ("meshrun: host 0: meshrun: host 1: lost host 1 ..."). */
static void error_line(const char *who, const char *fmt, va_list ap)
{
	char buf[4096];
	int head = snprintf(buf, sizeof(buf), "meshrun: %s: ", who);
	if (head < 0 || (size_t)head >= sizeof(buf) - 2)
		head = 0;
	int body = vsnprintf(buf + head, sizeof(buf) - (size_t)head - 1, fmt, ap);
	if (body < 0)
		body = 0;
	size_t len = (size_t)head + (size_t)body;
	if (len > sizeof(buf) - 2)	/* cut: a line still ends in a newline */
		len = sizeof(buf) - 2;
	buf[len++] = '\n';
	fwrite(buf, 1, len, stderr);
}

void cli_error(const char *who, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	error_line(who, fmt, ap);
	va_end(ap);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	error_line(cmd, fmt, ap);
	va_end(ap);
	/* "bench link" has bench's usage */
	char base[32];
	snprintf(base, sizeof(base), "%.*s", (int)strcspn(cmd, " "), cmd);
	cli_print_usage(stderr, base);
	return EXIT_USAGE;
}
