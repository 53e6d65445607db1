/* TLS between hosts (net/tls.h, net/tls_conn.h, net/conn.h) and the
 * rendezvous checks. In-process: two TLS connections over a socketpair pin
 * each other's host identity (asked through the connection table), use
 * TLS 1.3 with AES-128-GCM, and refuse a certificate from another CA. Against real agents on 127.0.0.1 (build/meshrun, or $MESHRUN):
 * `openssl s_client` without a certificate, with another CA's certificate,
 * and with a valid cluster certificate claiming another host id is refused
 * while the cluster still completes its job; a mismatched config hash, a
 * duplicate host id and an out-of-range host id are refused with clear
 * errors on both sides. A link renews its sending key (TLS 1.3 KeyUpdate)
 * every tls_key_update_bytes and the data arrives intact across the
 * renewals. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/cli.h"
#include "net/conn.h"
#include "net/frame.h"
#include "net/net.h"
#include "net/tls.h"
#include "net/tls_conn.h"

#include "tests/proc.h"

static void setup(void)
{
	proc_setup("check_tls", 6);
	/* a second, unrelated CA for the "wrong CA" cases */
	char dir[300], err[256];
	snprintf(dir, sizeof(dir), "%s/other", tmpdir);
	mkdir(dir, 0700);
	ck_assert_msg(tls_gen_certs(dir, 3, err, sizeof(err)) == 0, "%s", err);
}

/* `meshrun agent` for a pingpong job; extra key=value overrides follow. */
static void agent_start(struct proc *p, const char *name, int host, int hosts, int port,
			const char *extra)
{
	static char args[16][128];
	char *argv[20];
	int n = 0;
	snprintf(args[0], 128, "%s", meshrun());
	snprintf(args[1], 128, "agent");
	snprintf(args[2], 128, "--host-id=%d", host);
	snprintf(args[3], 128, "--hosts=%d", hosts);
	snprintf(args[4], 128, "--listen=127.0.0.1:0");
	snprintf(args[5], 128, "--job=pingpong");
	snprintf(args[6], 128, "--rounds=5");
	snprintf(args[7], 128, "certs_dir=%s/certs", tmpdir);
	snprintf(args[8], 128, "coordinator_address=127.0.0.1:%d", port);
	snprintf(args[9], 128, "connect_timeout_s=8");
	int k = 10;
	if (extra)
		snprintf(args[k++], 128, "%s", extra);
	for (n = 0; n < k; n++)
		argv[n] = args[n];
	argv[n] = NULL;
	proc_start(p, name, argv, -1);
}

/* ---- in-process TLS ---- */

static void cert_dir(char *out, size_t len, const char *which)
{
	snprintf(out, len, "%s/%s", tmpdir, which);
}

/* Drives both handshakes over a socketpair; returns the client's result and
 * the server's in *srv_rc. */
static int handshake_pair(SSL_CTX *sctx, SSL_CTX *cctx, struct conn **s, struct conn **c, int *srv_rc)
{
	int sv[2];
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	conn_set_nonblock(sv[0]);
	conn_set_nonblock(sv[1]);
	*s = tls_conn_new(sctx, sv[0], true);
	*c = tls_conn_new(cctx, sv[1], false);
	ck_assert_ptr_nonnull(*s);
	ck_assert_ptr_nonnull(*c);
	int rs = -EAGAIN, rcl = -EAGAIN;
	for (int i = 0; i < 1000 && (rs == -EAGAIN || rcl == -EAGAIN); i++) {
		if (rcl == -EAGAIN)
			rcl = conn_handshake(*c);
		if (rs == -EAGAIN)
			rs = conn_handshake(*s);
	}
	*srv_rc = rs;
	return rcl;
}

START_TEST(test_identity_pinned)
{
	char d[300], err[256];
	cert_dir(d, sizeof(d), "certs");
	SSL_CTX *h0 = tls_ctx_new(d, 0, err, sizeof(err));
	SSL_CTX *h2 = tls_ctx_new(d, 2, err, sizeof(err));
	ck_assert_msg(h0 && h2, "%s", err);
	struct conn *s, *c;
	int srs;
	ck_assert_int_eq(handshake_pair(h0, h2, &s, &c, &srs), 0);
	ck_assert_int_eq(srs, 0);
	SSL *cssl = tls_conn_ssl(c);
	ck_assert_ptr_nonnull(cssl);
	ck_assert_str_eq(SSL_get_version(cssl), "TLSv1.3");
	ck_assert_str_eq(SSL_CIPHER_get_name(SSL_get_current_cipher(cssl)), "TLS_AES_128_GCM_SHA256");
	ck_assert_int_eq(tls_peer_host(cssl, err, sizeof(err)), 0);
	/* the same identity through the connection table */
	ck_assert_int_eq(conn_peer_host(c, err, sizeof(err)), 0);
	ck_assert_int_eq(conn_peer_host(s, err, sizeof(err)), 2);
	ck_assert(tls_peer_is_host(s, 2, err, sizeof(err)));
	/* a valid cluster certificate for host 2 cannot pose as host 1 */
	ck_assert(!tls_peer_is_host(s, 1, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "'meshrun-host-2' does not match claimed host 1"));

	/* data both ways through the buffering BIO */
	char msg[40000], got[40000];
	for (size_t i = 0; i < sizeof(msg); i++)
		msg[i] = (char)(i * 13);
	size_t w = 0, r = 0;
	for (int i = 0; i < 10000 && r < sizeof(msg); i++) {
		if (w < sizeof(msg)) {
			ssize_t n = conn_write(c, msg + w, sizeof(msg) - w);
			ck_assert(n > 0 || n == -EAGAIN);
			if (n > 0)
				w += (size_t)n;
		}
		int f = conn_flush(c);
		ck_assert(f == 0 || f == -EAGAIN);
		ssize_t n = conn_read(s, got + r, sizeof(got) - r);
		ck_assert(n > 0 || n == -EAGAIN);
		if (n > 0)
			r += (size_t)n;
	}
	ck_assert_uint_eq(r, sizeof(msg));
	ck_assert_mem_eq(got, msg, sizeof(msg));
	conn_free(s);
	conn_free(c);
	tls_ctx_free(h0);
	tls_ctx_free(h2);
}
END_TEST

START_TEST(test_other_ca_refused)
{
	char d[300], o[300], err[256];
	cert_dir(d, sizeof(d), "certs");
	cert_dir(o, sizeof(o), "other");
	SSL_CTX *h0 = tls_ctx_new(d, 0, err, sizeof(err));
	SSL_CTX *x1 = tls_ctx_new(o, 1, err, sizeof(err));
	ck_assert_msg(h0 && x1, "%s", err);
	struct conn *s, *c;
	int srs;
	int crc = handshake_pair(h0, x1, &s, &c, &srs);
	/* the client refuses the server's chain; the server sees the alert */
	ck_assert_int_lt(crc, 0);
	ck_assert_int_ne(srs, 0);
	ck_assert_ptr_nonnull(strstr(c->err, "certificate verify failed"));
	conn_free(s);
	conn_free(c);
	tls_ctx_free(h0);
	tls_ctx_free(x1);
}
END_TEST

START_TEST(test_missing_files)
{
	char d[300], err[256];
	cert_dir(d, sizeof(d), "certs");
	ck_assert_ptr_null(tls_ctx_new(d, 9, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "host9.pem"));
	ck_assert_ptr_null(tls_ctx_new("/nonexistent", 0, err, sizeof(err)));
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/ca.pem"));
}
END_TEST

/* ---- real agents and openssl s_client ---- */

static void s_client(struct proc *p, const char *name, int port, const char *dir, int host,
		     int in_fd)
{
	static char args[12][300];
	char *argv[14];
	int k = 0;
	snprintf(args[k++], 300, "openssl");
	snprintf(args[k++], 300, "s_client");
	snprintf(args[k++], 300, "-connect");
	snprintf(args[k++], 300, "127.0.0.1:%d", port);
	snprintf(args[k++], 300, "-tls1_3");
	snprintf(args[k++], 300, "-quiet");
	snprintf(args[k++], 300, "-CAfile");
	snprintf(args[k++], 300, "%s/certs/ca.pem", tmpdir);
	if (dir) {
		snprintf(args[k++], 300, "-cert");
		snprintf(args[k++], 300, "%s/%s/host%d.pem", tmpdir, dir, host);
		snprintf(args[k++], 300, "-key");
		snprintf(args[k++], 300, "%s/%s/host%d.key", tmpdir, dir, host);
	}
	for (int i = 0; i < k; i++)
		argv[i] = args[i];
	argv[k] = NULL;
	proc_start(p, name, argv, in_fd);
}

START_TEST(test_s_client_refused)
{
	int port = free_port();
	struct proc h0, h1, a, b, c;
	agent_start(&h0, "h0", 0, 2, port, NULL);
	ck_assert_msg(wait_listening(port, 10), "coordinator never listened");

	/* no certificate */
	s_client(&a, "nocert", port, NULL, 0, -1);
	ck_assert_int_ne(proc_wait(&a, 10), -1);
	/* a certificate from another CA */
	s_client(&b, "otherca", port, "other", 1, -1);
	ck_assert_int_ne(proc_wait(&b, 10), -1);
	/* host 2's valid certificate sending a Hello that claims host 1 */
	int pipefd[2];
	ck_assert_int_eq(pipe(pipefd), 0);
	s_client(&c, "impostor", port, "certs", 2, pipefd[0]);
	close(pipefd[0]);
	{
		static uint8_t hash[32];
		uint8_t buf[512];
		Meshrun__Frame f = MESHRUN__FRAME__INIT;
		Meshrun__Hello h = MESHRUN__HELLO__INIT;
		h.host_id = 1;
		h.num_hosts = 2;
		h.devices = 1;
		h.data_address = "127.0.0.1:9";
		h.config_hash.data = hash;
		h.config_hash.len = sizeof(hash);
		h.version = NET_VERSION;
		f.link_seq = 1;
		f.body_case = MESHRUN__FRAME__BODY_HELLO;
		f.hello = &h;
		size_t n = frame_encode(&f, 0, buf);
		ck_assert_uint_gt(n, 0);
		ck_assert_int_eq(write(pipefd[1], buf, n), (ssize_t)n);
	}
	ck_assert_int_ne(proc_wait(&c, 10), -1);
	close(pipefd[1]);
	/* the impostor was told why */
	ck_assert_file_has(c.out, "certificate identity 'meshrun-host-2' does not match claimed host 1");

	/* the real host 1 joins and the job completes */
	agent_start(&h1, "h1", 1, 2, port, NULL);
	ck_assert_int_eq(proc_wait(&h0, 30), 0);
	ck_assert_int_eq(proc_wait(&h1, 30), 0);
	ck_assert_file_has(h0.out, "pingpong: 2 hosts x 1 devices, 5 rounds");
	ck_assert_file_has(h0.err, "peer did not return a certificate");
	ck_assert_file_has(h0.err, "certificate verify failed");
	ck_assert_file_has(h0.err, "certificate identity 'meshrun-host-2' does not match claimed host 1");
}
END_TEST

START_TEST(test_config_hash_mismatch)
{
	int port = free_port();
	struct proc h0, h1;
	agent_start(&h0, "h0", 0, 2, port, NULL);
	agent_start(&h1, "h1", 1, 2, port, "steps=3");
	ck_assert_int_eq(proc_wait(&h0, 20), EXIT_REFUSED);
	ck_assert_int_eq(proc_wait(&h1, 20), EXIT_REFUSED);
	ck_assert_file_has(h0.err, "host 1's config hash");
	ck_assert_file_has(h0.err, "differs from the coordinator's");
	ck_assert_file_has(h1.err, "meshrun: host 1: rendezvous refused by the coordinator");
	ck_assert_file_has(h1.err, "config hash");
}
END_TEST

START_TEST(test_duplicate_host_id)
{
	int port = free_port();
	struct proc h0, h1, dup, h2;
	agent_start(&h0, "h0", 0, 3, port, NULL);
	agent_start(&h1, "h1", 1, 3, port, NULL);
	ck_assert(wait_listening(port, 10));
	/* make sure the first host 1 is in before its twin */
	usleep(300000);
	agent_start(&dup, "dup", 1, 3, port, NULL);
	ck_assert_int_eq(proc_wait(&dup, 20), EXIT_REFUSED);
	ck_assert_file_has(dup.err, "duplicate host id 1");
	agent_start(&h2, "h2", 2, 3, port, NULL);
	ck_assert_int_eq(proc_wait(&h0, 30), 0);
	ck_assert_int_eq(proc_wait(&h1, 30), 0);
	ck_assert_int_eq(proc_wait(&h2, 30), 0);
	ck_assert_file_has(h0.err, "duplicate host id 1");
}
END_TEST

START_TEST(test_out_of_range_host_id)
{
	int port = free_port();
	struct proc h0, h1, bad;
	agent_start(&h0, "h0", 0, 2, port, NULL);
	/* an agent started for a larger cluster claims host 2 of 3 */
	agent_start(&bad, "bad", 2, 3, port, NULL);
	ck_assert_int_eq(proc_wait(&bad, 20), EXIT_REFUSED);
	ck_assert_file_has(bad.err, "host id 2 is out of range: the cluster has 2 hosts");
	agent_start(&h1, "h1", 1, 2, port, NULL);
	ck_assert_int_eq(proc_wait(&h0, 30), 0);
	ck_assert_int_eq(proc_wait(&h1, 30), 0);
	ck_assert_file_has(h0.err, "host id 2 is out of range");
}
END_TEST

/* Keys renewed every 64 KiB: an all_to_all and a permute of 1 MiB, 8
 * times each, arrive intact (`wrong` 0) and host 0 counts its KeyUpdates:
 * at least one per 64 KiB it sent. */
START_TEST(test_key_update)
{
	struct proc p;
	char *const argv[] = { (char *)meshrun(), "bench", "collectives", "--hosts", "2", "--op", "permute",
			       "--sizes", "1M", "--iters", "8", "--warmup", "1", "tls_key_update_bytes=65536",
			       NULL };
	proc_start(&p, "bench", argv, -1);
	ck_assert_int_eq(proc_wait(&p, 60), 0);
	char *out = slurp(p.out);
	ck_assert_msg(strstr(out, "  1048576       262144") && strstr(out, "      0\n"), "%s", out);
	const char *k = strstr(out, "# tls key updates sent by host 0 so far: ");
	ck_assert_msg(k, "%s", out);
	long n = strtol(k + strlen("# tls key updates sent by host 0 so far: "), NULL, 10);
	/* 9 permutes of 1 MiB from host 0 = 144 renewals, and the barriers */
	ck_assert_msg(n >= 144 && n < 400, "%ld key updates:\n%s", n, out);

	char *const bad[] = { (char *)meshrun(), "bench", "collectives", "--hosts", "2", "--op", "permute",
			      "--sizes", "1M", "tls_key_update_bytes=1000", NULL };
	proc_start(&p, "bad", bad, -1);
	ck_assert_int_eq(proc_wait(&p, 30), EXIT_CONFIG);
	ck_assert_file_has(p.err, "key 'tls_key_update_bytes' must be in [65536, 2^38]");
}
END_TEST

static Suite *tls_suite(void)
{
	Suite *s = suite_create("tls");
	TCase *tc = tcase_create("in_process");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, test_identity_pinned);
	tcase_add_test(tc, test_other_ca_refused);
	tcase_add_test(tc, test_missing_files);
	suite_add_tcase(s, tc);

	tc = tcase_create("s_client");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_s_client_refused);
	suite_add_tcase(s, tc);

	tc = tcase_create("rendezvous");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_config_hash_mismatch);
	tcase_add_test(tc, test_duplicate_host_id);
	tcase_add_test(tc, test_out_of_range_host_id);
	tcase_add_test(tc, test_key_update);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	SRunner *sr = srunner_create(tls_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
