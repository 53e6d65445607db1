/* The sockets net/conn.c makes: on loopback a listener's accepted socket
 * and a dialed one run cubic or reno (conn_congestion), not the kernel's
 * default (BBR on the bench machine, whose pacing timers cost a 16 MiB op
 * a quarter of its CPU: bench/results/transport.md, tcp19);
 * MESHRUN_TCP_CC picks another and "kernel" leaves the kernel's. On any
 * other address the kernel's choice stands (a listener on 0.0.0.0). */
#include <check.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/conn.h"

static void cc_of(int fd, char *out, size_t n)
{
	socklen_t l = (socklen_t)n;
	memset(out, 0, n);
	ck_assert_int_eq(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, out, &l), 0);
}

/* the kernel's default for a fresh socket */
static void kernel_cc(char *out, size_t n)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(fd, 0);
	cc_of(fd, out, n);
	close(fd);
}

/* a listener on 127.0.0.1, a dial to it, the accepted end: both ends' CC */
static void pair(char *dial, char *acc, size_t n)
{
	char err[200], addr[64];
	int lfd = -1;
	ck_assert_msg(conn_listen("127.0.0.1:0", &lfd, err, sizeof(err)) == 0, "%s", err);
	conn_sockname(lfd, true, addr, sizeof(addr));
	int cfd = conn_connect_start(addr, err, sizeof(err));
	ck_assert_msg(cfd >= 0, "%s", err);
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	ck_assert_int_eq(poll(&p, 1, 5000), 1);
	int afd = conn_accept(lfd, NULL, 0);
	ck_assert_int_ge(afd, 0);
	cc_of(cfd, dial, n);
	cc_of(afd, acc, n);
	close(afd);
	close(cfd);
	close(lfd);
}

START_TEST(test_cubic_or_reno)
{
	char d[16], a[16];
	unsetenv("MESHRUN_TCP_CC");
	pair(d, a, sizeof(d));
	ck_assert_msg(!strcmp(d, "cubic") || !strcmp(d, "reno"), "dialed socket: %s", d);
	ck_assert_msg(!strcmp(a, "cubic") || !strcmp(a, "reno"), "accepted socket: %s", a);
}
END_TEST

START_TEST(test_env_kernel_and_reno)
{
	char d[16], a[16], k[16];
	kernel_cc(k, sizeof(k));
	setenv("MESHRUN_TCP_CC", "kernel", 1);
	pair(d, a, sizeof(d));
	ck_assert_str_eq(d, k);
	ck_assert_str_eq(a, k);
	setenv("MESHRUN_TCP_CC", "reno", 1);
	pair(d, a, sizeof(d));
	unsetenv("MESHRUN_TCP_CC");
	ck_assert_str_eq(d, "reno");
	ck_assert_str_eq(a, "reno");
}
END_TEST

/* a listener on every address (0.0.0.0, as an agent's off loopback)
 * keeps the kernel's choice, so what it accepts does: the administrator's
 * on a real network */
START_TEST(test_not_loopback_kernel)
{
	char k[16], got[16], err[200];
	int lfd = -1;
	unsetenv("MESHRUN_TCP_CC");
	kernel_cc(k, sizeof(k));
	ck_assert_msg(conn_listen("0.0.0.0:0", &lfd, err, sizeof(err)) == 0, "%s", err);
	cc_of(lfd, got, sizeof(got));
	close(lfd);
	ck_assert_str_eq(got, k);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("conn");
	TCase *tc = tcase_create("congestion");
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_cubic_or_reno);
	tcase_add_test(tc, test_env_kernel_and_reno);
	tcase_add_test(tc, test_not_loopback_kernel);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
