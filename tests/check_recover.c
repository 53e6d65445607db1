/* Link recovery with real agents on loopback: `ss -K` (iproute2) resets
 * live TCP connections from outside the processes, and the job must go on
 * with every collective element right and training losses bit-identical
 * (data parallel on 3 hosts; FSDP, tensor, expert and pipeline parallel
 * over the DCN link of 2 hosts x 2 devices, with a corrupted record too); a link
 * black-holed for less than heartbeat_timeout_s carries on, for longer
 * fails the job within that deadline; a reconnect presenting another
 * host's certificate or another job's id is refused without touching the
 * running link; a link that cannot come back fails the job within
 * link_reconnect_timeout_s, naming the host, its address and what was
 * running; data frames dropped on the way (the drop fault) are resent
 * after the gap breaks the link, through every collective (the list
 * forms' messages over many runs too) and in training; every link socket carries TCP_USER_TIMEOUT, redials too.
 * Needs MESHRUN (the binary) and root (ss -K, pidfd_getfd). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "net/conn.h"
#include "net/frame.h"
#include "net/tls.h"
#include "net/tls_conn.h"
#include "tests/proc.h"
#include "tests/fake_peer.h"

static void setup(void)
{
	proc_setup("check_recover", 3);
}

/* Resets (ss -K) every established TCP connection to or from a port that
 * a process of group pgid listens on: every link its agents have. The
 * number of connections reset. */
static int reset_links(pid_t pgid)
{
	int ports[64], np = 0, killed = 0;
	char line[1024];
	FILE *f = popen("ss -tlnpH 2>/dev/null", "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) && np < 64) {
		char local[128];
		if (sscanf(line, "%*s %*s %*s %127s", local) != 1)
			continue;
		char *colon = strrchr(local, ':');
		bool ours = false;
		for (char *q = line; (q = strstr(q, "pid=")); q += 4)
			ours |= getpgid((pid_t)atoi(q + 4)) == pgid;
		if (colon && ours)
			ports[np++] = atoi(colon + 1);
	}
	pclose(f);
	for (int i = 0; i < np; i++) {
		char cmd[200];
		snprintf(cmd, sizeof(cmd),
			 "ss -K -tnH state established '( sport = :%d or dport = :%d )' 2>/dev/null",
			 ports[i], ports[i]);
		f = popen(cmd, "r");
		ck_assert_ptr_nonnull(f);
		while (fgets(line, sizeof(line), f))
			killed++;
		pclose(f);
	}
	return killed;
}

/* While p runs: `times` resets of all its links, `gap_s` apart, the first
 * after first_s. The number of connections reset. */
static int reset_during(struct proc *p, double first_s, int times, double gap_s)
{
	int killed = 0;
	usleep((useconds_t)(first_s * 1e6));
	for (int i = 0; i < times && proc_wait(p, 0) == -1; i++) {
		killed += reset_links(p->pid);
		usleep((useconds_t)(gap_s * 1e6));
	}
	return killed;
}

/* ---- collectives ---- */

/* Every op at 16 MiB per rank on 3 hosts, each checked element by element,
 * four rounds, with every link reset every 2 s meanwhile. */
START_TEST(test_reset_collectives)
{
	struct proc p;
	const char *c = "4194304";
	char counts[200];
	snprintf(counts, sizeof(counts), "%s,%s,%s,%s", c, c, c, c);
	proc_meshrun(&p, "coll", "bench", "collectives", "--hosts", "3", "--check-counts", counts,
		    (char *)NULL);
	int killed = reset_during(&p, 2.0, 5, 2.0);
	ck_assert_msg(proc_wait(&p, 200) == 0, "bench failed:\n%s\n%s", slurp(p.out), slurp(p.err));
	ck_assert_msg(killed >= 3, "only %d connections were reset", killed);
	ck_assert_file_has(p.out, "check ok: 12 ops x 4 counts on 3 devices");
	ck_assert_file_has(p.err, "resumed after");
}
END_TEST

/* ---- training ---- */

static char *loss_lines(const char *metrics, long *reconnects)
{
	char *all = strdup(slurp(metrics)), *out = all ? calloc(1, strlen(all) + 1) : NULL;
	ck_assert_ptr_nonnull(out);
	*reconnects = 0;
	for (char *l = strtok(all, "\n"); l; l = strtok(NULL, "\n")) {
		char *h = strstr(l, "\"loss_hex\":\""), *r = strstr(l, "\"reconnects\":");
		if (h) {
			strncat(out, h, (size_t)(strchr(h + 12, '"') - h + 1));
			strcat(out, "\n");
		}
		if (r)
			*reconnects = atol(r + 13);
	}
	free(all);
	return out;
}

/* llama-tiny on 3 hosts (data parallel), links reset three times: per-step
 * losses bit-identical to an undisturbed run, reconnects in the metrics. */
START_TEST(test_reset_training)
{
	struct proc a, b;
	char ma[300], mb[300];
	snprintf(ma, sizeof(ma), "%s/a.jsonl", tmpdir);
	snprintf(mb, sizeof(mb), "%s/b.jsonl", tmpdir);
	proc_meshrun(&a, "train_a", "local", "--hosts", "3", "--config", "configs/llama-tiny.yml",
		    "per_device_batch_size=2", "dcn_data_parallelism=3", "steps=80", "--metrics", ma,
		    (char *)NULL);
	ck_assert_msg(proc_wait(&a, 120) == 0, "undisturbed run failed:\n%s", slurp(a.err));
	proc_meshrun(&b, "train_b", "local", "--hosts", "3", "--config", "configs/llama-tiny.yml",
		    "per_device_batch_size=2", "dcn_data_parallelism=3", "steps=80", "--metrics", mb,
		    (char *)NULL);
	ck_assert_msg(proc_wait_output(&b, "completed step: 5,", 60), "no step 5:\n%s",
		      slurp(b.err));
	int killed = reset_during(&b, 0.2, 3, 1.0);
	ck_assert_msg(proc_wait(&b, 120) == 0, "disturbed run failed:\n%s", slurp(b.err));
	ck_assert_msg(killed >= 3, "only %d connections were reset", killed);
	long ra, rb;
	char *la = loss_lines(ma, &ra), *lb = loss_lines(mb, &rb);
	ck_assert_msg(strlen(la) > 0, "no losses in %s", ma);
	ck_assert_str_eq(la, lb);
	ck_assert_int_eq(ra, 0);
	ck_assert_msg(rb > 0, "no reconnects in the metrics:\n%s", slurp(mb));
	free(la);
	free(lb);
}
END_TEST

/* ---- training under other parallelisms, links reset and a byte corrupted ---- */

/* `meshrun local --hosts 2 --devices-per-host 2` training `config` for 10
 * steps with the keys `keys` (NULL-terminated, at most 6: the mesh and
 * what else the run needs), metrics to tmpdir/NAME.jsonl, with the faults
 * fault1 and fault2 (or none: both NULL). */
static void run_mesh(struct proc *p, const char *name, const char *config,
		     const char *const *keys, const char *fault1, const char *fault2)
{
	char cfg[200], metrics[300];
	const char *k[6] = { 0 };
	for (int i = 0; i < 6 && keys[i]; i++)
		k[i] = keys[i];
	ck_assert_ptr_null(k[5]);               /* room for the NULL below */
	snprintf(cfg, sizeof(cfg), "--config=configs/%s", config);
	snprintf(metrics, sizeof(metrics), "--metrics=%s/%s.jsonl", tmpdir, name);
	/* the keys last: the first NULL ends the list */
	if (fault1)
		proc_meshrun(p, name, "local", "--hosts", "2", "--devices-per-host", "2", cfg,
			    "dcn_data_parallelism=1", "steps=10", "openblas_threads=1", metrics,
			    "--fault", fault1, "--fault", fault2, k[0], k[1], k[2], k[3], k[4],
			    (char *)NULL);
	else
		proc_meshrun(p, name, "local", "--hosts", "2", "--devices-per-host", "2", cfg,
			    "dcn_data_parallelism=1", "steps=10", "openblas_threads=1", metrics,
			    k[0], k[1], k[2], k[3], k[4], (char *)NULL);
}

/* The mesh's traffic crosses the one DCN link (0-1). An undisturbed run,
 * then the same run with: every data frame host 1 sends to host 0 delayed 3 ms
 * (so the ten steps last long enough, on any machine, for what follows),
 * one byte of host 0's 6th data frame to host 1 corrupted on the wire (a
 * TLS error: the link redials and resends) and, from step 1 on, every link
 * reset (ss -K) three times 0.3 s apart. Per-step losses are bit-identical
 * and the metrics count reconnects. */
static void disturbed_mesh(const char *config, const char *const *keys)
{
	struct proc a, b;
	char ma[300], mb[300];
	snprintf(ma, sizeof(ma), "%s/plain.jsonl", tmpdir);
	snprintf(mb, sizeof(mb), "%s/hit.jsonl", tmpdir);
	run_mesh(&a, "plain", config, keys, NULL, NULL);
	ck_assert_msg(proc_wait(&a, 90) == 0, "undisturbed run failed:\n%s", slurp(a.err));
	run_mesh(&b, "hit", config, keys, "delay:link=1-0:ms=3",
		 "corrupt:link=0-1:frame=6");
	ck_assert_msg(proc_wait_output(&b, "completed step: 1,", 60), "no step 1:\n%s",
		      slurp(b.err));
	int rounds = 0;
	for (int i = 0; i < 3 && proc_wait(&b, 0) == -1; i++) {
		rounds += reset_links(b.pid) > 0;
		usleep(300000);
	}
	ck_assert_msg(proc_wait(&b, 90) == 0, "disturbed run failed:\n%s", slurp(b.err));
	ck_assert_msg(rounds == 3, "only %d of 3 resets found live links:\n%s", rounds,
		      slurp(b.err));
	ck_assert_file_has(b.err, "host 0: fault: injected corrupt on link 0-1 at frame 6");
	ck_assert_file_has(b.err, "bad record mac");
	ck_assert_file_has(b.err, "resumed after");
	long ra, rb;
	char *la = loss_lines(ma, &ra), *lb = loss_lines(mb, &rb);
	ck_assert_msg(strlen(la) > 0, "no losses in %s", ma);
	ck_assert_str_eq(la, lb);
	ck_assert_int_eq(ra, 0);
	ck_assert_msg(rb > 0, "no reconnects in the metrics:\n%s", slurp(mb));
	free(la);
	free(lb);
}

/* FSDP across the hosts: parameter all-gathers and gradient
 * reduce-scatters on the DCN link. */
START_TEST(test_disturbed_fsdp)
{
	disturbed_mesh("llama-tiny.yml",
		       (const char *[]){ "dcn_fsdp_parallelism=2", "ici_data_parallelism=2", NULL });
}
END_TEST

/* Tensor parallel across the hosts: activations' all-reduces per layer. */
START_TEST(test_disturbed_tensor)
{
	disturbed_mesh("llama-tiny.yml",
		       (const char *[]){ "dcn_tensor_parallelism=2", "ici_data_parallelism=2", NULL });
}
END_TEST

/* Expert parallel across the hosts: the MoE all-to-alls. */
START_TEST(test_disturbed_expert)
{
	disturbed_mesh("deepseek-tiny.yml",
		       (const char *[]){ "dcn_expert_parallelism=2", "ici_data_parallelism=2", NULL });
}
END_TEST

/* The pipeline across the hosts: stage 0 on host 0, stage 1 on host 1,
 * four microbatches whose activations (forward) and their gradients
 * (backward) cross the DCN link as point-to-point sends, besides the
 * data-parallel all-reduces inside each host. */
START_TEST(test_disturbed_pipeline)
{
	disturbed_mesh("llama-tiny.yml",
		       (const char *[]){ "dcn_pipeline_parallelism=2", "ici_data_parallelism=2",
					 "num_pipeline_microbatches=4", "base_num_decoder_layers=4",
					 NULL });
}
END_TEST

/* ---- a black-holed link ---- */

/* `meshrun local --hosts 2` pingpong (every byte checked), 8 rounds of
 * 1 MiB, host 0 black-holing its link to host 1 for `secs` from its 20th
 * data frame (round 1). Heartbeats every 0.25 s, heartbeat_timeout_s=2;
 * link_reconnect_timeout_s stays at its 30 s: a black hole does not break
 * the link (the socket stays open, nothing is read or written), so only
 * the silence deadline can end it. */
/* silence: link_silence_s (the half-open deadline) */
static void run_hole(struct proc *p, const char *name, const char *secs, const char *silence)
{
	char fault[80], silence_kv[40];
	snprintf(fault, sizeof(fault), "blackhole:link=0-1:frame=20:s=%s", secs);
	snprintf(silence_kv, sizeof(silence_kv), "link_silence_s=%s", silence);
	proc_meshrun(p, name, "local", "--hosts", "2", "--job=pingpong", "--size=1M", "--rounds=8",
		    "heartbeat_interval_s=0.25", "heartbeat_timeout_s=2", silence_kv,
		    "link_reconnect_timeout_s=30", "--fault", fault, (char *)NULL);
}

#define HOLE_FIRED "host 0: fault: injected blackhole on link 0-1 at frame 20"

/* Shorter than the deadlines (half-open at 1.6 s, lost at 2 s): the link
 * carries on, every byte right. (With the default link_silence_s, 0.8 s
 * here, a 0.8 s hole was sometimes taken for half-open under load.) */
START_TEST(test_blackhole_short)
{
	struct proc p;
	run_hole(&p, "short", "0.8", "1.6");
	ck_assert_msg(proc_wait(&p, 60) == 0, "pingpong failed:\n%s", slurp(p.err));
	ck_assert_file_has(p.out, "pingpong: 2 hosts x 1 devices, 8 rounds of 1048576 bytes: ok");
	ck_assert_file_has(p.err, HOLE_FIRED);
	ck_assert_msg(!file_has(p.err, "lost host") && !file_has(p.err, "broke"), "log:\n%s",
		      slurp(p.err));
}
END_TEST

/* Longer (6 s) than heartbeat_timeout_s (2 s): the hosts of the link find
 * each other silent, the job fails with exit 5 naming the lost host, and
 * no agent is left. The bound is from the moment the fault's log line is
 * seen (polled every 10 ms): heartbeat_timeout_s for the silence (counted
 * from the last frame before the hole, so at most that) plus 2 s for the
 * launcher's grace to the other host, its kill and reaping on a loaded
 * 2-core machine. It ends well before the hole would (6 s) and far before
 * link_reconnect_timeout_s (30 s). */
START_TEST(test_blackhole_long)
{
	struct proc p;
	run_hole(&p, "long", "6", "0");
	double end = now_s() + 60;
	while (!file_has(p.err, HOLE_FIRED) && proc_wait(&p, 0) == -1 && now_s() < end)
		usleep(10000);
	double t0 = now_s();
	ck_assert_msg(file_has(p.err, HOLE_FIRED), "the fault never fired:\n%s", slurp(p.err));
	int rc = proc_wait(&p, 60);
	double dt = now_s() - t0;
	ck_assert_msg(rc == 5, "local exited %d:\n%s", rc, slurp(p.err));
	ck_assert_msg(dt <= 2.0 + 2.0, "failed %.2f s after the fault, want <= 4 s:\n%s", dt,
		      slurp(p.err));
	ck_assert_msg(kill(-p.pid, 0) == -1 && errno == ESRCH, "an agent is left");
	ck_assert_file_has(p.err, ": lost host ");
	ck_assert_file_has(p.err, "(127.0.0.1:");
	ck_assert_file_has(p.err, "no heartbeat for 2.");
	ck_assert_msg(!file_has(p.out, ": ok"), "pingpong reported ok");
}
END_TEST

/* ---- refused reconnects ---- */

/* The next frame of kind body on c; heartbeats, acks, receive posts skipped. */
static Meshrun__Frame *next_of(struct conn *c, struct fake_rx *rx, int body)
{
	return fake_expect(c, rx, body);
}

/* Dials the agent's link listener as `cert_host`, sends a resume hello
 * claiming host 0 of job `job`, and expects a Refuse naming `why`. */
static void bad_resume(const char *certs, int cert_host, const char *data_addr, uint64_t job,
		       const char *why, struct proc *agent)
{
	char err[256];
	struct fake_rx *rx = calloc(1, sizeof(*rx));
	ck_assert_ptr_nonnull(rx);
	SSL_CTX *ctx = tls_ctx_new(certs, cert_host, err, sizeof(err));
	ck_assert_msg(ctx, "%s", err);
	int fd = conn_connect_start(data_addr, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	ck_assert_int_eq(poll(&p, 1, 10000), 1);
	ck_assert_int_eq(conn_connect_result(fd), 0);
	struct conn *c = tls_conn_new(ctx, fd, false);
	ck_assert_ptr_nonnull(c);
	fake_handshake(c, agent);
	Meshrun__Frame f = MESHRUN__FRAME__INIT;
	Meshrun__LinkHello h = MESHRUN__LINK_HELLO__INIT;
	h.host_id = 0;
	h.job_id = job;
	h.resume = true;
	h.last_seq = 0;
	f.link_seq = 0;
	f.body_case = MESHRUN__FRAME__BODY_LINK_HELLO;
	f.link_hello = &h;
	fake_send(c, &f);
	Meshrun__Frame *r = next_of(c, rx, MESHRUN__FRAME__BODY_REFUSE);
	ck_assert_msg(strstr(r->refuse->reason, why), "refused for '%s', want '%s'",
		      r->refuse->reason, why);
	frame_header_free(r);
	conn_free(c);
	SSL_CTX_free(ctx);
	free(rx);
}

/* A real agent (host 1) and a fake host 0 (coordinator and link peer).
 * With the link up, two reconnects claim to be host 0's: one with host
 * 2's certificate, one with another job's id. Both are refused; the link
 * goes on (its sequence numbers continue) and the agent runs on. */
START_TEST(test_refused_resume)
{
	char certs[300], err[256], addr[128], coord_kv[160], certs_kv[330];
	int port = free_port(), lfd;
	struct fake_rx *rx = calloc(1, sizeof(*rx));
	struct proc a;
	ck_assert_ptr_nonnull(rx);
	snprintf(certs, sizeof(certs), "%s/certs", tmpdir);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	ck_assert_msg(conn_listen(addr, &lfd, err, sizeof(err)) == 0, "%s", err);
	SSL_CTX *ctx = tls_ctx_new(certs, 0, err, sizeof(err));
	ck_assert_msg(ctx, "%s", err);
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s", certs);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=%s", addr);
	proc_meshrun(&a, "agent", "agent", "--host-id=1", "--hosts=2", "--listen=127.0.0.1:0",
		    "--job=pingpong", "--rounds=1", "--size=1K", certs_kv, coord_kv,
		    "heartbeat_interval_s=0.05", "heartbeat_timeout_s=60", "collective_timeout_s=60",
		    "connect_timeout_s=20", (char *)NULL);

	/* rendezvous: the agent's Hello, our Topology (job 42) */
	char data_addr[128];
	struct conn *cc = fake_rendezvous(lfd, ctx, &a, rx, 42, data_addr, sizeof(data_addr));

	/* the link: we dial as host 0, LinkHello both ways, Barrier both ways */
	struct conn *c = fake_dial_link(ctx, data_addr, &a, rx);
	Meshrun__Frame *f;
	Meshrun__Frame lf = MESHRUN__FRAME__INIT;
	Meshrun__LinkHello lh = MESHRUN__LINK_HELLO__INIT;
	lh.host_id = 0;
	lh.job_id = 42;
	lf.link_seq = 1;
	lf.body_case = MESHRUN__FRAME__BODY_LINK_HELLO;
	lf.link_hello = &lh;
	fake_send(c, &lf);
	frame_header_free(fake_expect(c, rx, MESHRUN__FRAME__BODY_LINK_HELLO));
	Meshrun__Frame bf = MESHRUN__FRAME__INIT;
	Meshrun__Barrier b = MESHRUN__BARRIER__INIT;
	b.seq = 1;
	bf.link_seq = 2;
	bf.body_case = MESHRUN__FRAME__BODY_BARRIER;
	bf.barrier = &b;
	fake_send(c, &bf);
	f = fake_expect(c, rx, MESHRUN__FRAME__BODY_BARRIER);
	uint64_t seq0 = f->link_seq;
	frame_header_free(f);

	bad_resume(certs, 2, data_addr, 42, "host-2", &a);
	bad_resume(certs, 0, data_addr, 43, "another job", &a);

	/* the link runs on: heartbeats with the next sequence numbers */
	uint64_t last = seq0;
	for (int beats = 0; beats < 5;) {
		f = fake_recv(c, rx, now_s() + 10, false);
		if (f->link_seq) {
			ck_assert_uint_eq(f->link_seq, last + 1);
			last = f->link_seq;
		}
		beats += f->body_case == MESHRUN__FRAME__BODY_HEARTBEAT;
		frame_header_free(f);
	}
	ck_assert_msg(proc_wait(&a, 0) == -1, "the agent ended:\n%s", slurp(a.err));
	char *log = slurp(a.err);
	ck_assert_msg(strstr(log, "refused link from") && !strstr(log, "broke") &&
		      !strstr(log, "lost"), "agent log:\n%s", log);
	conn_free(c);
	conn_free(cc);
	SSL_CTX_free(ctx);
	free(rx);
}
END_TEST

/* ---- a link that cannot come back ---- */

/* Host 1 is stopped (SIGSTOP) and its links are reset: host 0 redials,
 * the kernel accepts, nobody answers the handshake. Host 0 fails after
 * link_reconnect_timeout_s (heartbeats would take far longer), naming the
 * host, its address and what was running. */
START_TEST(test_reconnect_timeout)
{
	struct proc h[2];
	char certs_kv[330], coord_kv[64];
	int port = free_port();
	snprintf(certs_kv, sizeof(certs_kv), "certs_dir=%s/certs", tmpdir);
	snprintf(coord_kv, sizeof(coord_kv), "coordinator_address=127.0.0.1:%d", port);
	for (int i = 0; i < 2; i++) {
		char hid[32], name[8];
		snprintf(hid, sizeof(hid), "--host-id=%d", i);
		snprintf(name, sizeof(name), "h%d", i);
		proc_meshrun(&h[i], name, "agent", hid, "--hosts=2", "--listen=127.0.0.1:0",
			    "--job=pingpong", "--rounds=100000000", "--size=1M", certs_kv, coord_kv,
			    "heartbeat_interval_s=0.25", "heartbeat_timeout_s=30",
			    "link_reconnect_timeout_s=2", "connect_timeout_s=10", (char *)NULL);
	}
	ck_assert_msg(wait_listening(port, 10), "coordinator never listened");
	usleep(1500000);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(proc_wait(&h[i], 0) == -1, "host %d ended early:\n%s", i,
			      slurp(h[i].err));
	ck_assert_int_eq(kill(h[1].pid, SIGSTOP), 0);
	double t0 = now_s();
	ck_assert_int_ge(reset_links(h[1].pid), 1);
	int rc = proc_wait(&h[0], 20);
	double dt = now_s() - t0;
	kill(h[1].pid, SIGKILL);
	ck_assert_msg(rc == 5, "host 0 exited %d:\n%s", rc, slurp(h[0].err));
	ck_assert_msg(dt < 15, "host 0 took %.1f s", dt);
	ck_assert_file_has(h[0].err, "lost host 1 (127.0.0.1:");
	ck_assert_file_has(h[0].err, "link down for 2 s");
	ck_assert_file_has(h[0].err, " during ");
}
END_TEST

/* ---- dropped frames ---- */

static int count_of(const char *path, const char *needle)
{
	int k = 0;
	for (const char *s = slurp(path); (s = strstr(s, needle)); s += strlen(needle))
		k++;
	return k;
}

/* Every op at three counts on 3 hosts, each element checked, with 12 data
 * frames dropped (never written) over the run on all six directed links:
 * each gap breaks its link, the redial resends from the gap, and every
 * element is right. */
START_TEST(test_drop_collectives)
{
	struct proc p;
	static const char *const spec[] = {
		"drop:link=0-1:frame=2",   "drop:link=1-0:frame=9",   "drop:link=1-2:frame=30",
		"drop:link=2-1:frame=60",  "drop:link=2-0:frame=100", "drop:link=0-2:frame=150",
		"drop:link=0-1:frame=200", "drop:link=1-2:frame=250", "drop:link=2-0:frame=300",
		"drop:link=1-0:frame=120", "drop:link=2-1:frame=140", "drop:link=0-2:frame=40",
	};
	/* one argument (tests/proc.h keeps 300 bytes of each) */
	char faults[300] = "faults=";
	for (size_t i = 0; i < sizeof(spec) / sizeof(spec[0]); i++)
		snprintf(faults + strlen(faults), sizeof(faults) - strlen(faults), "%s%s",
			 i ? "," : "", spec[i]);
	proc_meshrun(&p, "coll", "bench", "collectives", "--hosts", "3", "--check-counts",
		    "1000,300000,1000000", faults, (char *)NULL);
	ck_assert_msg(proc_wait(&p, 120) == 0, "bench failed:\n%s\n%s", slurp(p.out), slurp(p.err));
	ck_assert_file_has(p.out, "check ok: 12 ops x 3 counts on 3 devices");
	ck_assert_int_lt(strlen(faults), sizeof(faults) - 1);
	int fired = count_of(p.err, "fault: injected drop");
	ck_assert_msg(fired == 12, "%d of 12 drops fired:\n%s", fired, slurp(p.err));
	ck_assert_int_ge(count_of(p.err, "frames lost on the way"), 12);
	/* both ends of each broken link say so */
	ck_assert_int_ge(count_of(p.err, "resumed after"), 24);
}
END_TEST

/* The list forms only (all_gather_v, reduce_scatter_v over runs of 128
 * floats with gaps: a message over many runs), six data frames dropped
 * on the ring's links (0->1->2->0 carry their data): each resend of a
 * message over runs lands right, those of many fragments kept by
 * reference to its runs and the one-fragment ones copied. */
START_TEST(test_drop_lists)
{
	struct proc p;
	proc_meshrun(&p, "lists", "bench", "collectives", "--hosts", "3", "--check-counts",
		    "300000,1000000", "--check-lists",
		    "faults=drop:link=0-1:frame=5,drop:link=1-2:frame=30,drop:link=2-0:frame=60,"
		    "drop:link=0-1:frame=150,drop:link=1-2:frame=220,drop:link=2-0:frame=300",
		    (char *)NULL);
	ck_assert_msg(proc_wait(&p, 120) == 0, "bench failed:\n%s\n%s", slurp(p.out), slurp(p.err));
	ck_assert_file_has(p.out, "check ok: 3 ops x 2 counts on 3 devices");
	int fired = count_of(p.err, "fault: injected drop");
	ck_assert_msg(fired == 6, "%d of 6 drops fired:\n%s", fired, slurp(p.err));
	ck_assert_int_ge(count_of(p.err, "frames lost on the way"), 6);
}
END_TEST

/* llama-tiny on 3 hosts (data parallel: the ring runs 0->1->2->0), six
 * data frames dropped over 20 steps: per-step losses bit-identical to an
 * undisturbed run. */
START_TEST(test_drop_training)
{
	struct proc a, b;
	char ma[300], mb[300];
	snprintf(ma, sizeof(ma), "%s/a.jsonl", tmpdir);
	snprintf(mb, sizeof(mb), "%s/b.jsonl", tmpdir);
	proc_meshrun(&a, "train_a", "local", "--hosts", "3", "--config", "configs/llama-tiny.yml",
		    "per_device_batch_size=2", "dcn_data_parallelism=3", "steps=20", "--metrics", ma,
		    (char *)NULL);
	ck_assert_msg(proc_wait(&a, 120) == 0, "undisturbed run failed:\n%s", slurp(a.err));
	proc_meshrun(&b, "train_b", "local", "--hosts", "3", "--config", "configs/llama-tiny.yml",
		    "per_device_batch_size=2", "dcn_data_parallelism=3", "steps=20", "--metrics", mb,
		    "faults=drop:link=0-1:frame=5,drop:link=1-2:frame=60,drop:link=2-0:frame=150,"
		    "drop:link=0-1:frame=300,drop:link=1-2:frame=500,drop:link=2-0:frame=700",
		    (char *)NULL);
	ck_assert_msg(proc_wait(&b, 120) == 0, "disturbed run failed:\n%s", slurp(b.err));
	int fired = count_of(b.err, "fault: injected drop");
	ck_assert_msg(fired == 6, "%d of 6 drops fired:\n%s", fired, slurp(b.err));
	ck_assert_int_ge(count_of(b.err, "frames lost on the way"), 6);
	long ra, rb;
	char *la = loss_lines(ma, &ra), *lb = loss_lines(mb, &rb);
	ck_assert_msg(strlen(la) > 0, "no losses in %s", ma);
	ck_assert_str_eq(la, lb);
	ck_assert_int_eq(ra, 0);
	/* host 0's metrics count its own links' reconnects: 0-1 and 2-0 */
	ck_assert_msg(rb >= 4, "%ld reconnects in the metrics, want 4 or more", rb);
	free(la);
	free(lb);
}
END_TEST

/* ---- TCP_USER_TIMEOUT ---- */

/* Every established TCP socket held by a process of group pgid, taken out
 * of it with pidfd_getfd (root): how many there are, and how many carry
 * TCP_USER_TIMEOUT = want_ms. */
static void user_timeouts(pid_t pgid, unsigned want_ms, int *sockets, int *right)
{
	*sockets = *right = 0;
	DIR *procs = opendir("/proc");
	ck_assert_ptr_nonnull(procs);
	for (struct dirent *e; (e = readdir(procs));) {
		pid_t pid = (pid_t)atoi(e->d_name);
		if (pid <= 0 || getpgid(pid) != pgid)
			continue;
		int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
		char dir[64];
		snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
		DIR *fds = pfd >= 0 ? opendir(dir) : NULL;
		for (struct dirent *f; fds && (f = readdir(fds));) {
			int fd = (int)syscall(SYS_pidfd_getfd, pfd, atoi(f->d_name), 0);
			struct tcp_info ti;
			socklen_t len = sizeof(ti);
			unsigned v = 0;
			socklen_t vl = sizeof(v);
			if (fd >= 0 && !getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) &&
			    ti.tcpi_state == TCP_ESTABLISHED &&
			    !getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, &vl)) {
				++*sockets;
				*right += v == want_ms;
			}
			if (fd >= 0)
				close(fd);
		}
		if (fds)
			closedir(fds);
		if (pfd >= 0)
			close(pfd);
	}
	closedir(procs);
}

/* 3 hosts training with heartbeat_timeout_s=7: every link socket of every
 * agent has TCP_USER_TIMEOUT 7000 ms, and so do the ones redialed after
 * every link is reset. */
START_TEST(test_user_timeout)
{
	struct proc p;
	proc_meshrun(&p, "train", "local", "--hosts", "3", "--config", "configs/llama-tiny.yml",
		    "per_device_batch_size=2", "dcn_data_parallelism=3", "steps=400",
		    "heartbeat_timeout_s=7", (char *)NULL);
	ck_assert_msg(proc_wait_output(&p, "completed step: 2,", 60), "no step 2:\n%s",
		      slurp(p.err));
	int n, ok;
	user_timeouts(p.pid, 7000, &n, &ok);
	/* 3 links, both ends of each */
	ck_assert_msg(n >= 6, "only %d established sockets", n);
	ck_assert_int_eq(ok, n);
	ck_assert_int_ge(reset_links(p.pid), 3);
	for (double end = now_s() + 30; !file_has(p.err, "resumed after") && now_s() < end;)
		usleep(50000);
	ck_assert_msg(file_has(p.err, "resumed after"), "no resume:\n%s", slurp(p.err));
	usleep(500000);
	user_timeouts(p.pid, 7000, &n, &ok);
	ck_assert_msg(n >= 6, "only %d established sockets after the resets", n);
	ck_assert_int_eq(ok, n);
	proc_kill(&p);
}
END_TEST

static Suite *recover_suite(void)
{
	Suite *s = suite_create("recover");
	TCase *tc = tcase_create("reset");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_reset_collectives);
	tcase_add_test(tc, test_reset_training);
	suite_add_tcase(s, tc);

	tc = tcase_create("meshes");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 200);
	tcase_add_test(tc, test_disturbed_fsdp);
	tcase_add_test(tc, test_disturbed_tensor);
	tcase_add_test(tc, test_disturbed_expert);
	tcase_add_test(tc, test_disturbed_pipeline);
	suite_add_tcase(s, tc);

	tc = tcase_create("blackhole");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_blackhole_short);
	tcase_add_test(tc, test_blackhole_long);
	suite_add_tcase(s, tc);

	tc = tcase_create("refused");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_refused_resume);
	suite_add_tcase(s, tc);

	tc = tcase_create("timeout");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_reconnect_timeout);
	suite_add_tcase(s, tc);

	tc = tcase_create("drop");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 200);
	tcase_add_test(tc, test_drop_collectives);
	tcase_add_test(tc, test_drop_lists);
	tcase_add_test(tc, test_drop_training);
	suite_add_tcase(s, tc);

	tc = tcase_create("user_timeout");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_user_timeout);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	SRunner *sr = srunner_create(recover_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
