/* The hostfile parser of `meshrun launch` (host/launch/hostfile.c): the
 * forms mpirun and DeepSpeed accept, comments and blank lines, and every
 * refusal naming its file and line. tests/check-launch runs the launcher
 * itself against real machines. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "host/launch/hostfile.h"

static char err[512];

START_TEST(test_forms)
{
	struct hostfile_entry *h = NULL;
	int n = 0;
	const char *text = "# cluster\n"
			   "node0\n"
			   "\n"
			   "  alice@10.0.0.2:2222   slots=1   # the second\n"
			   "gpu-b.example.org\tslots=1\r\n"
			   "bob@node_3";
	ck_assert_int_eq(hostfile_parse("hf", text, &h, &n, err, sizeof(err)), 0);
	ck_assert_int_eq(n, 4);
	ck_assert_str_eq(h[0].host, "node0");
	ck_assert_str_eq(h[0].user, "");
	ck_assert_int_eq(h[0].port, 0);
	ck_assert_int_eq(h[0].line, 2);
	ck_assert_str_eq(h[1].user, "alice");
	ck_assert_str_eq(h[1].host, "10.0.0.2");
	ck_assert_int_eq(h[1].port, 2222);
	ck_assert_int_eq(h[1].line, 4);
	ck_assert_str_eq(h[2].host, "gpu-b.example.org");
	ck_assert_str_eq(h[3].user, "bob");
	ck_assert_str_eq(h[3].host, "node_3");
	ck_assert_int_eq(h[3].line, 6);
	free(h);
}
END_TEST

static void refused(const char *text, const char *want)
{
	struct hostfile_entry *h = NULL;
	int n = 0;
	err[0] = 0;
	ck_assert_int_eq(hostfile_parse("hf", text, &h, &n, err, sizeof(err)), -EBADMSG);
	ck_assert_msg(strstr(err, want), "'%s' lacks '%s'", err, want);
	ck_assert_ptr_null(h);
}

START_TEST(test_refusals)
{
	refused("a\nb\na\n", "hf:3: 'a' is already on line 1");
	refused("a\nb slots=2\n", "hf:2: 'slots=2'");
	refused("a slots=\n", "hf:1: 'slots='");
	refused("a:0\n", "hf:1: bad ssh port '0'");
	refused("a:22x\n", "hf:1: bad ssh port");
	refused("a:\n", "hf:1: bad ssh port");
	refused("a max_slots=4\n", "hf:1: unexpected 'max_slots=4'");
	refused("-oProxyCommand=x\n", "hf:1: bad host");
	refused("a;rm\n", "hf:1: bad host");
	refused("@a\n", "hf:1: bad user name ''");
	refused("us$er@a\n", "hf:1: bad user name");
	refused("# only comments\n\n   \n", "hf: no machines");
	refused("", "hf: no machines");
}
END_TEST

/* the same host on two ssh ports is two machines (two sshd, as in tests) */
START_TEST(test_same_host_other_port)
{
	struct hostfile_entry *h = NULL;
	int n = 0;
	ck_assert_int_eq(hostfile_parse("hf", "a:22\na:2222\n", &h, &n, err, sizeof(err)), 0);
	ck_assert_int_eq(n, 2);
	free(h);
}
END_TEST

START_TEST(test_read_missing)
{
	struct hostfile_entry *h = NULL;
	int n = 0;
	ck_assert_int_eq(hostfile_read("/nonexistent/hosts", &h, &n, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/hosts"));
}
END_TEST

static Suite *hostfile_suite(void)
{
	Suite *s = suite_create("hostfile");
	TCase *tc = tcase_create("parse");
	tcase_add_test(tc, test_forms);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_same_host_other_port);
	tcase_add_test(tc, test_read_missing);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(hostfile_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
