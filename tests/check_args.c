/* The command-line parser (host/cli/args.c) and the one mapping from
 * library results to exit codes: both flag forms, unknown flags, missing
 * values, ranges, overrides and --config files applied in order. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/cli/args.h"
#include "host/cli/cli.h"
#include "host/config/config.h"

static char err[512];

/* The flags of a pretend command, stored in these. */
static const char *name;
static int count;
static long big;
static double secs;
static size_t bytes;
static bool verbose;

static const struct arg_flag flags[] = {
	{ "--name", ARG_STR, &name, 0, 0, NULL },
	{ "--count", ARG_INT, &count, 1, 100, NULL },
	{ "--big", ARG_LONG, &big, 0, 1e12, NULL },
	{ "--secs", ARG_DOUBLE, &secs, 0, 60, NULL },
	{ "--size", ARG_BYTES, &bytes, 0, 1 << 30, NULL },
	{ "--verbose", ARG_BOOL, &verbose, 0, 0, NULL },
	{ "--config", ARG_CONFIG, NULL, 0, 0, NULL },
	{ "--host-id", ARG_REFUSE, NULL, 0, 0, "--host-id is chosen by the launcher" },
	{ NULL, 0, NULL, 0, 0, NULL },
};
static const struct arg_flag *const tables[] = { flags, NULL };

/* Parses a NULL-terminated argument list (argv[0] "cmd" added). */
static int parse(struct args *a, const char *const *list)
{
	static char *argv[64];
	int argc = 0;
	argv[argc++] = "cmd";
	for (; *list; list++)
		argv[argc++] = (char *)*list;
	argv[argc] = NULL;
	name = NULL;
	count = 0;
	big = 0;
	secs = 0;
	bytes = 0;
	verbose = false;
	err[0] = 0;
	return args_parse(a, tables, argc, argv, err, sizeof(err));
}

#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })

START_TEST(test_both_forms)
{
	struct args a;
	ck_assert_int_eq(parse(&a, ARGS("--name", "x", "--count", "7", "--big", "5000000000",
					"--secs", "1.5", "--size", "64K", "--verbose")), 0);
	ck_assert_str_eq(name, "x");
	ck_assert_int_eq(count, 7);
	ck_assert(big == 5000000000L);
	ck_assert(secs == 1.5);
	ck_assert_uint_eq(bytes, 65536);
	ck_assert(verbose);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--name=y", "--count=8", "--big=6", "--secs=2", "--size=1M")), 0);
	ck_assert_str_eq(name, "y");
	ck_assert_int_eq(count, 8);
	ck_assert(big == 6);
	ck_assert(secs == 2);
	ck_assert_uint_eq(bytes, 1 << 20);
	ck_assert(!verbose);
	args_release(&a);
	/* a value may contain '=' and start with '-' */
	ck_assert_int_eq(parse(&a, ARGS("--name=a=b")), 0);
	ck_assert_str_eq(name, "a=b");
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--name", "-z")), 0);
	ck_assert_str_eq(name, "-z");
	args_release(&a);
}
END_TEST

START_TEST(test_usage_errors)
{
	struct args a;
	ck_assert_int_eq(parse(&a, ARGS("--nope", "1")), -EINVAL);
	ck_assert_msg(strstr(err, "unknown option '--nope'"), "%s", err);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--nope=1")), -EINVAL);
	ck_assert_msg(strstr(err, "unknown option '--nope'"), "%s", err);
	args_release(&a);
	/* a prefix of a flag is not the flag */
	ck_assert_int_eq(parse(&a, ARGS("--coun=3")), -EINVAL);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--count")), -EINVAL);
	ck_assert_msg(strstr(err, "--count needs a value"), "%s", err);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--name", "x", "--config")), -EINVAL);
	ck_assert_msg(strstr(err, "--config needs a value"), "%s", err);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--count", "0")), -EINVAL);
	ck_assert_msg(strstr(err, "--count") && strstr(err, "'0'"), "%s", err);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--count=12x")), -EINVAL);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--secs", "61")), -EINVAL);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--size", "lots")), -EINVAL);
	ck_assert_msg(strstr(err, "--size"), "%s", err);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--verbose=yes")), -EINVAL);
	ck_assert_msg(strstr(err, "--verbose takes no value"), "%s", err);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--host-id", "1")), -EINVAL);
	ck_assert_str_eq(err, "--host-id is chosen by the launcher");
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("stray")), -EINVAL);
	ck_assert_msg(strstr(err, "unexpected argument 'stray'"), "%s", err);
	args_release(&a);
}
END_TEST

START_TEST(test_overrides_and_configs_in_order)
{
	struct args a;
	ck_assert_int_eq(parse(&a, ARGS("steps=3", "--config", "a.yml", "--count=2", "steps=4",
					"--config=b.yml", "log_period=2")), 0);
	ck_assert_int_eq(a.nconfigs, 2);
	ck_assert_str_eq(a.configs[0], "a.yml");
	ck_assert_str_eq(a.configs[1], "b.yml");
	ck_assert_int_eq(a.noverrides, 3);
	ck_assert_str_eq(a.overrides[0], "steps=3");
	ck_assert_str_eq(a.overrides[1], "steps=4");
	ck_assert_str_eq(a.overrides[2], "log_period=2");
	/* who took each argument: a launcher forwards by it */
	ck_assert_ptr_eq(a.owner[1], NULL);
	ck_assert_str_eq(a.owner[2]->name, "--config");
	ck_assert_str_eq(a.owner[3]->name, "--config");
	ck_assert_str_eq(a.owner[4]->name, "--count");
	ck_assert_ptr_eq(a.owner[5], NULL);
	args_release(&a);
}
END_TEST

static const char *write_tmp(const char *text)
{
	static char path[2][64];
	static int k;
	char *p = path[k++ % 2];
	strcpy(p, "/tmp/meshrun-args-XXXXXX");
	int fd = mkstemp(p);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return p;
}

/* files in order, then every override in order, whatever the order on the
 * command line */
START_TEST(test_load_cfg_order)
{
	static struct cfg c;
	struct args a;
	const char *f1 = write_tmp("steps: 11\nlog_period: 5\n");
	const char *f2 = write_tmp("steps: 22\n");
	ck_assert_int_eq(parse(&a, ARGS("steps=33", "--config", f1, "steps=44", "--config", f2)), 0);
	ck_assert_msg(args_load_cfg(&a, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.steps, 44);
	ck_assert_int_eq(c.log_period, 5);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("--config", f1, "--config", f2)), 0);
	ck_assert_msg(args_load_cfg(&a, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.steps, 22);
	args_release(&a);
	/* a missing file and a bad key are config errors */
	ck_assert_int_eq(parse(&a, ARGS("--config", "/nonexistent/x.yml")), 0);
	ck_assert_int_eq(args_load_cfg(&a, &c, err, sizeof(err)), -EINVAL);
	args_release(&a);
	ck_assert_int_eq(parse(&a, ARGS("no_such_key=1")), 0);
	ck_assert_int_eq(args_load_cfg(&a, &c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "no_such_key"), "%s", err);
	args_release(&a);
	unlink(f1);
	unlink(f2);
}
END_TEST

/* errno names the docs' table may use */
static const struct { const char *name; int e; } errnos[] = {
	{ "EINVAL", EINVAL }, { "EBADMSG", EBADMSG }, { "EHOSTDOWN", EHOSTDOWN },
	{ "ECONNREFUSED", ECONNREFUSED }, { "EKEYREJECTED", EKEYREJECTED },
	{ "ETIMEDOUT", ETIMEDOUT }, { "ENOMEM", ENOMEM }, { "ENOSPC", ENOSPC },
	{ "EBUSY", EBUSY }, { "ERANGE", ERANGE },
};

/* One truth: every row of docs/conventions.md's errno table ("| `-EINVAL`
 * | ... | 3 |") is what cli_exit_code does, every row of docs/failures.md's
 * exit-code table ("| 5 | peer lost | ... |") what cli_exit_name says,
 * and the latter lists every code the CLI has. */
START_TEST(test_exit_codes_as_documented)
{
	char line[2048];
	FILE *f = fopen("docs/conventions.md", "r");
	ck_assert_msg(f, "run from the repository's root");
	int rows = 0;
	while (fgets(line, sizeof(line), f)) {
		char name[32];
		int code, at = 0;
		const char *bar = strrchr(line, '|');
		if (sscanf(line, " | `-%31[A-Z]` |%n", name, &at) != 1 || !at || !bar)
			continue;
		const char *p = bar - 1;
		while (p > line && *p == ' ')
			p--;
		while (p > line && p[-1] >= '0' && p[-1] <= '9')
			p--;
		ck_assert_msg(sscanf(p, "%d", &code) == 1, "no code in: %s", line);
		int e = 0;
		for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
			if (!strcmp(errnos[i].name, name))
				e = errnos[i].e;
		ck_assert_msg(e, "errno %s of docs/conventions.md unknown to this test", name);
		ck_assert_msg(cli_exit_code(-e) == code, "-%s: docs say %d, cli_exit_code %d", name, code,
			      cli_exit_code(-e));
		rows++;
	}
	fclose(f);
	ck_assert_int_ge(rows, 9);

	f = fopen("docs/failures.md", "r");
	ck_assert(f);
	bool in_table = false;
	int seen[256] = { 0 }, ncodes = 0;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "## ", 3))
			in_table = !strncmp(line, "## Exit codes", 13);
		int code, at = 0;
		if (!in_table || sscanf(line, "| %d |%n", &code, &at) != 1 || !at)
			continue;
		char meaning[128];
		snprintf(meaning, sizeof(meaning), "%.*s", (int)strcspn(line + at, "|"), line + at);
		char *m = meaning;
		while (*m == ' ')
			m++;
		for (size_t n = strlen(m); n && m[n - 1] == ' '; n--)
			m[n - 1] = 0;
		ck_assert_msg(code >= 0 && code < 256 && !seen[code], "code %d twice", code);
		seen[code] = 1;
		ncodes++;
		ck_assert_msg(!strcmp(cli_exit_name(code), m), "code %d: docs say '%s', cli_exit_name '%s'",
			      code, m, cli_exit_name(code));
	}
	fclose(f);
	const int codes[] = { EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_CONFIG, EXIT_INPUT, EXIT_PEER_LOST,
			      EXIT_REFUSED, EXIT_TLS, EXIT_INTERRUPTED };
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		ck_assert_msg(seen[codes[i]], "exit code %d is not in docs/failures.md", codes[i]);
	ck_assert_int_eq(ncodes, (int)(sizeof(codes) / sizeof(codes[0])));
}
END_TEST

START_TEST(test_exit_codes)
{
	ck_assert_int_eq(cli_exit_code(0), EXIT_OK);
	ck_assert_int_eq(cli_exit_code(-EINVAL), EXIT_CONFIG);
	ck_assert_int_eq(cli_exit_code(-EBADMSG), EXIT_INPUT);
	ck_assert_int_eq(cli_exit_code(-EHOSTDOWN), EXIT_PEER_LOST);
	ck_assert_int_eq(cli_exit_code(-ECONNREFUSED), EXIT_REFUSED);
	ck_assert_int_eq(cli_exit_code(-ETIMEDOUT), EXIT_FAIL);
	ck_assert_int_eq(cli_exit_code(-ENOMEM), EXIT_FAIL);
	ck_assert_int_eq(cli_exit_code(-EIO), EXIT_FAIL);
	ck_assert_int_eq(cli_exit_code(-EKEYREJECTED), EXIT_TLS);
	ck_assert_int_eq(cli_exit_code(-ENOSPC), EXIT_FAIL);
	ck_assert_str_eq(cli_exit_name(EXIT_PEER_LOST), "peer lost");
	ck_assert_str_eq(cli_exit_name(EXIT_CONFIG), "config error");
}
END_TEST

static Suite *args_suite(void)
{
	Suite *s = suite_create("args");
	TCase *tc = tcase_create("parse");
	tcase_add_test(tc, test_both_forms);
	tcase_add_test(tc, test_usage_errors);
	tcase_add_test(tc, test_overrides_and_configs_in_order);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	tc = tcase_create("config");
	tcase_add_test(tc, test_load_cfg_order);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	tc = tcase_create("exit codes");
	tcase_add_test(tc, test_exit_codes);
	tcase_add_test(tc, test_exit_codes_as_documented);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(args_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
