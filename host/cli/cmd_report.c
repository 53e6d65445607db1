/* `meshrun report METRICS.jsonl [--trace TRACE.json] -o FILE.svg`: the
 * command line around report_write (host/obs/report.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "host/cli/cli.h"
#include "host/obs/report.h"

static int report_usage(const char *why)
{
	return cli_usage_error("report", "%s", why);
}

int cmd_report(int argc, char **argv)
{
	const char *metrics = NULL, *trace = NULL, *out = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--trace") || !strcmp(argv[i], "-o")) {
			if (i + 1 >= argc)
				return report_usage(!strcmp(argv[i], "-o") ? "-o needs a file" : "--trace needs a file");
			*(argv[i][1] == 'o' ? &out : &trace) = argv[i + 1];
			i++;
		} else if (argv[i][0] == '-') {
			char why[96];
			snprintf(why, sizeof(why), "unknown option '%.60s'", argv[i]);
			return report_usage(why);
		} else if (metrics) {
			return report_usage("one metrics file only");
		} else {
			metrics = argv[i];
		}
	}
	if (!metrics || !out)
		return report_usage(!metrics ? "a metrics file is needed" : "-o FILE.svg is needed");
	char err[512], warn[512];
	int rc = report_write(metrics, trace, out, warn, sizeof(warn), err, sizeof(err));
	/* report_write's lines start "report: " */
	if (warn[0])
		fprintf(stderr, "meshrun: %s\n", warn);
	if (rc) {
		fprintf(stderr, "meshrun: %s\n", err);
		return rc == -EBADMSG ? EXIT_INPUT : EXIT_FAIL;
	}
	printf("report: wrote %s\n", out);
	return EXIT_OK;
}
