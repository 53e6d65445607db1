/* One host's agent (host/agent.h): mesh, xport and net thread, one thread
 * per local device running the job, then a clean Done exchange or an abort.
 * Also `meshrun agent` and its built-in self-test job "pingpong". */
#include "host/agent/agent.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/cli.h"
#include "host/launch/local.h"
#include "host/train/run.h"
#include "host/train/train_job.h"
#include "net/conn.h"
#include "net/net.h"

/* net reports failure classes as negative errnos (enum net_status); jobs
 * and agent_run speak exit codes. These two keep the codes users see. */
static int exit_of_net(int status)
{
	switch (status) {
	case NET_OK: return EXIT_OK;
	case NET_ERR_CONFIG: return EXIT_CONFIG;
	case -EBADMSG: return EXIT_INPUT;
	case NET_ERR_PEER_LOST: return EXIT_PEER_LOST;
	case NET_ERR_REFUSED: return EXIT_REFUSED;
	default: return EXIT_FAIL;
	}
}

static int net_of_exit(int code)
{
	switch (code) {
	case EXIT_OK: return NET_OK;
	case EXIT_CONFIG: return NET_ERR_CONFIG;
	case EXIT_INPUT: return -EBADMSG;
	case EXIT_PEER_LOST: return NET_ERR_PEER_LOST;
	case EXIT_REFUSED: return NET_ERR_REFUSED;
	default: return NET_ERR;
	}
}

/* How long device threads get to notice a failure before we stop waiting. */
#define DEVICE_GRACE_NS (2000ull * 1000 * 1000)

struct agent {
	const struct cfg *cfg;
	struct mesh mesh;
	int host_id;
	agent_job_fn job;
	struct xport *x;
	struct net *net;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int running;
};

/* --listen of `meshrun agent`; NULL otherwise */
static const char *listen_override;

uint64_t agent_dcn_bytes_sent(struct agent *a)
{
	return a && a->net ? net_bytes_sent(a->net) : 0;
}

uint64_t agent_tls_key_updates(struct agent *a)
{
	return a && a->net ? net_key_updates(a->net) : 0;
}

static void *device_main(void *p)
{
	struct device_ctx *d = p;
	struct agent *a = d->agent;
	int rc = a->job(d);
	if (rc) {
		char msg[640];
		snprintf(msg, sizeof(msg), "device %d: %s", d->device_id,
			 d->err[0] ? d->err : "job failed");
		/* wakes the sibling devices and tells the other hosts */
		net_abort(a->net, net_of_exit(rc), msg);
	}
	pthread_mutex_lock(&a->mu);
	a->running--;
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
	return NULL;
}

/* An inherited listening socket named by env var, or -1. The variable is
 * consumed so nothing started later inherits the claim. */
static int env_fd(const char *name)
{
	const char *v = getenv(name);
	int fd = -1, acc = 0;
	socklen_t l = sizeof(acc);
	if (v) {
		char *end;
		long x = strtol(v, &end, 10);
		if (!*end && x > 2 && x < 65536 &&
		    !getsockopt((int)x, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) && acc)
			fd = (int)x;
		unsetenv(name);
	}
	return fd;
}

static bool is_loopback(const char *host)
{
	return !strncmp(host, "127.", 4) || !strcmp(host, "localhost") || !strcmp(host, "::1");
}

/* Where this host accepts links: --listen, else hosts[host_id], else the
 * port after the coordinator's plus host_id. */
static int listen_address(const struct cfg *cfg, int host_id, char *out, size_t len,
			  char *err, size_t errlen)
{
	char host[256];
	int port;
	if (listen_override) {
		snprintf(out, len, "%s", listen_override);
		return 0;
	}
	if (cfg->hosts.n > host_id) {
		snprintf(out, len, "%s", cfg->hosts.item[host_id]);
		return 0;
	}
	if (conn_split_addr(cfg->coordinator_address, host, sizeof(host), &port) || port == 0) {
		snprintf(err, errlen, "config: key 'coordinator_address' wants host:port, got '%s'",
			 cfg->coordinator_address);
		return -EINVAL;
	}
	snprintf(out, len, "%s:%d", is_loopback(host) ? "127.0.0.1" : "0.0.0.0",
		 port + 1 + host_id);
	return 0;
}

int agent_run(const struct cfg *cfg, int host_id, agent_job_fn job, void *job_arg,
	      char *err, size_t errlen)
{
	struct agent a = { .cfg = cfg, .host_id = host_id, .job = job };
	char listen[CFG_STR], why[512];
	int status = EXIT_OK;
	int *dev_host = NULL;
	struct device_ctx *devs = NULL;
	pthread_t *threads = NULL;
	int started = 0;

	mesh_init(&a.mesh, cfg);
	if (host_id < 0 || host_id >= a.mesh.num_hosts) {
		snprintf(err, errlen, "host id %d is out of range: the mesh has %d hosts", host_id,
			 a.mesh.num_hosts);
		return EXIT_USAGE;
	}
	if (listen_address(cfg, host_id, listen, sizeof(listen), err, errlen))
		return EXIT_CONFIG;

	struct net_params p = {
		.host_id = host_id,
		.num_hosts = a.mesh.num_hosts,
		.devices_per_host = a.mesh.devices_per_host,
		.coordinator = cfg->coordinator_address,
		.listen = listen,
		.coord_fd = env_fd("MESHRUN_COORD_FD"),
		.data_fd = env_fd("MESHRUN_DATA_FD"),
		.certs_dir = cfg->certs_dir,
		.heartbeat_interval_s = cfg->heartbeat_interval_s,
		.heartbeat_timeout_s = cfg->heartbeat_timeout_s,
		.connect_timeout_s = cfg->connect_timeout_s,
		.done_timeout_s = cfg->collective_timeout_s,
		.max_frame_bytes = (uint64_t)cfg->max_frame_bytes,
		.key_update_bytes = (uint64_t)cfg->tls_key_update_bytes,
	};
	cfg_hash(cfg, p.config_hash);
	a.net = net_new(&p, &status, err, errlen);
	if (!a.net)
		return exit_of_net(status);

	dev_host = malloc(sizeof(int) * (size_t)a.mesh.num_devices);
	devs = calloc((size_t)a.mesh.devices_per_host, sizeof(*devs));
	threads = calloc((size_t)a.mesh.devices_per_host, sizeof(*threads));
	if (!dev_host || !devs || !threads) {
		snprintf(err, errlen, "out of memory");
		status = EXIT_FAIL;
		goto out_free;
	}
	for (int d = 0; d < a.mesh.num_devices; d++)
		dev_host[d] = mesh_host_of(&a.mesh, d);
	a.x = xport_new(host_id, a.mesh.num_devices, dev_host,
			a.mesh.num_hosts > 1 ? net_xport_ops() : NULL, a.net);
	if (!a.x) {
		snprintf(err, errlen, "out of memory");
		status = EXIT_FAIL;
		goto out_free;
	}
	/* 8 small messages in flight to each host before one has to wait */
	xport_set_eager(a.x, (size_t)cfg->eager_max_bytes, 8 * (size_t)cfg->eager_max_bytes);
	net_set_xport(a.net, a.x);

	status = exit_of_net(net_start(a.net, err, errlen));
	if (status)
		goto out_free;

	pthread_mutex_init(&a.mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&a.cv, &ca);
	pthread_condattr_destroy(&ca);

	for (int i = 0; i < a.mesh.devices_per_host; i++) {
		struct device_ctx *d = &devs[i];
		d->agent = &a;
		d->cfg = cfg;
		d->mesh = &a.mesh;
		d->xport = a.x;
		d->host_id = host_id;
		d->local_index = i;
		d->device_id = mesh_device_of(&a.mesh, host_id, i);
		d->job_arg = job_arg;
		pthread_mutex_lock(&a.mu);
		a.running++;
		pthread_mutex_unlock(&a.mu);
		if (pthread_create(&threads[i], NULL, device_main, d)) {
			pthread_mutex_lock(&a.mu);
			a.running--;
			pthread_mutex_unlock(&a.mu);
			net_abort(a.net, NET_ERR, "unable to start a device thread");
			break;
		}
		started++;
	}

	/* wait for the devices; after a failure give them a moment to notice */
	uint64_t give_up = 0;
	pthread_mutex_lock(&a.mu);
	while (a.running > 0) {
		uint64_t now = xport_now_ns();
		uint64_t t = now + 100ull * 1000 * 1000;
		struct timespec ts = { .tv_sec = (time_t)(t / 1000000000ull),
				       .tv_nsec = (long)(t % 1000000000ull) };
		pthread_cond_timedwait(&a.cv, &a.mu, &ts);
		if (!give_up && net_failed(a.net, NULL, 0))
			give_up = now + DEVICE_GRACE_NS;
		if (give_up && xport_now_ns() > give_up)
			break;
	}
	bool all_back = a.running == 0;
	pthread_mutex_unlock(&a.mu);

	if (!all_back) {
		/* a device is stuck outside the transport: report and leave the
		 * process to exit around it (nothing it uses may be freed) */
		status = exit_of_net(net_failed(a.net, why, sizeof(why)));
		snprintf(err, errlen, "%s (a device thread did not stop)", why);
		return status ? status : EXIT_FAIL;
	}
	for (int i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	pthread_mutex_destroy(&a.mu);
	pthread_cond_destroy(&a.cv);

	status = net_failed(a.net, err, errlen);
	if (!status)
		status = net_finish(a.net, err, errlen);
	status = exit_of_net(status);

out_free:
	net_free(a.net);
	xport_free(a.x);
	free(dev_host);
	free(devs);
	free(threads);
	return status;
}

/* ---- the pingpong self-test job ---- */

struct pingpong_arg {
	size_t size;
	long rounds;
	double hold_s;     /* linger after the last round: a slow finisher */
};

#define PINGPONG_GROUP 0xfffe

static uint64_t pattern_word(int dev, long round, size_t i)
{
	uint64_t x = ((uint64_t)dev << 40) ^ ((uint64_t)round << 8) ^ 0x9e3779b97f4a7c15ull;
	x *= 0xbf58476d1ce4e5b9ull;
	return (x ^ (x >> 31)) + i * 0x94d049bb133111ebull;
}

static void fill(uint8_t *buf, size_t size, int dev, long round)
{
	size_t i, words = size / 8;
	for (i = 0; i < words; i++) {
		uint64_t w = pattern_word(dev, round, i);
		memcpy(buf + 8 * i, &w, 8);
	}
	if (size % 8) {
		uint64_t w = pattern_word(dev, round, i);
		memcpy(buf + 8 * i, &w, size % 8);
	}
}

/* Index of the first byte that differs from the pattern, or size. */
static size_t check(const uint8_t *buf, size_t size, int dev, long round)
{
	size_t i, words = size / 8;
	for (i = 0; i < words; i++) {
		uint64_t w = pattern_word(dev, round, i);
		if (memcmp(buf + 8 * i, &w, 8))
			break;
	}
	uint64_t w = pattern_word(dev, round, i);
	const uint8_t *wb = (const uint8_t *)&w;
	for (size_t b = 8 * i; b < size && b < 8 * i + 8; b++)
		if (buf[b] != wb[b - 8 * i])
			return b;
	return size;
}

/* Every device sends to the same local device of the next host and
 * receives from the previous one, rounds times, checking every byte. */
static int pingpong_job(struct device_ctx *d)
{
	const struct pingpong_arg *pa = d->job_arg;
	const struct mesh *m = d->mesh;
	int H = m->num_hosts;
	int next = mesh_device_of(m, (d->host_id + 1) % H, d->local_index);
	int prev = mesh_device_of(m, (d->host_id + H - 1) % H, d->local_index);
	uint8_t *sb = malloc(pa->size ? pa->size : 1), *rb = malloc(pa->size ? pa->size : 1);
	char why[400];
	int rc = EXIT_OK;
	uint64_t t0 = xport_now_ns();

	if (!sb || !rb) {
		snprintf(d->err, sizeof(d->err), "pingpong: out of memory for %zu bytes", pa->size);
		rc = EXIT_FAIL;
		goto out;
	}
	for (long r = 0; r < pa->rounds; r++) {
		struct xmeta meta = { .op = MESHRUN__COLL_OP__COLL_P2P, .group = PINGPONG_GROUP,
				      .seq = (uint64_t)r, .step = (uint64_t)r };
		struct xreq *rr, *sr;
		uint64_t deadline = xport_now_ns() + (uint64_t)(d->cfg->collective_timeout_s * 1e9);
		fill(sb, pa->size, d->device_id, r);
		memset(rb, 0, pa->size);
		int e = xport_irecv(d->xport, prev, d->device_id, &meta, rb, pa->size, &rr);
		if (e) {
			xport_failed(d->xport, why, sizeof(why));
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: recv: %s", r,
				 why[0] ? why : strerror(-e));
			rc = EXIT_PEER_LOST;
			goto out;
		}
		e = xport_isend(d->xport, d->device_id, next, &meta, sb, pa->size, &sr);
		if (e) {
			xport_wait(rr, 1, why, sizeof(why));
			xport_failed(d->xport, why, sizeof(why));
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: send: %s", r,
				 why[0] ? why : strerror(-e));
			rc = EXIT_PEER_LOST;
			goto out;
		}
		int e1 = xport_wait(sr, deadline, why, sizeof(why));
		if (e1)
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: %s", r, why);
		int e2 = xport_wait(rr, deadline, why, sizeof(why));
		if (e2 && !e1)
			snprintf(d->err, sizeof(d->err), "pingpong round %ld: %s", r, why);
		if (e1 || e2) {
			rc = (e1 == -EMSGSIZE || e2 == -EMSGSIZE) ? EXIT_FAIL : EXIT_PEER_LOST;
			goto out;
		}
		size_t bad = check(rb, pa->size, prev, r);
		if (bad != pa->size) {
			snprintf(d->err, sizeof(d->err),
				 "pingpong round %ld: byte %zu of %zu from device %d is wrong", r, bad,
				 pa->size, prev);
			rc = EXIT_FAIL;
			goto out;
		}
	}
	if (d->device_id == 0) {
		double s = (double)(xport_now_ns() - t0) / 1e9;
		printf("pingpong: %d hosts x %d devices, %ld rounds of %zu bytes: ok in %.3f s (%.3f GB/s per device)\n",
		       H, m->devices_per_host, pa->rounds, pa->size, s,
		       s > 0 ? (double)pa->size * (double)pa->rounds / s / 1e9 : 0.0);
		fflush(stdout);
	}
	if (pa->hold_s > 0) {
		struct timespec ts = { .tv_sec = (time_t)pa->hold_s,
				       .tv_nsec = (long)((pa->hold_s - (double)(time_t)pa->hold_s) * 1e9) };
		nanosleep(&ts, NULL);
	}
out:
	free(sb);
	free(rb);
	return rc;
}

/* ---- `meshrun agent` ---- */

struct job_entry {
	const char *name;
	agent_job_fn fn;
};

static const struct job_entry jobs[] = {
	{ "train", train_job },
	{ "pingpong", pingpong_job },
	{ NULL, NULL },
};

/* "--name value" or "--name=value" at argv[*i]: the value, advancing *i. */
static const char *flag_value(int argc, char **argv, int *i, const char *name, bool *bad)
{
	size_t n = strlen(name);
	if (strncmp(argv[*i], name, n))
		return NULL;
	if (argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (argv[*i][n])
		return NULL;
	if (*i + 1 >= argc) {
		*bad = true;
		return NULL;
	}
	return argv[++*i];
}

int cmd_agent(int argc, char **argv)
{
	static struct cfg cfg;
	char err[640];
	const char *job_name = "train";
	struct pingpong_arg pp = { .size = 1 << 20, .rounds = 10 };
	int host_id = -1;
	char **rest = calloc((size_t)argc + 1, sizeof(char *));
	int nrest = 0;
	int rc;

	if (!rest) {
		fprintf(stderr, "meshrun: agent: out of memory\n");
		return EXIT_FAIL;
	}
	rest[nrest++] = argv[0];
	for (int i = 1; i < argc; i++) {
		bool bad = false;
		const char *v;
		if ((v = flag_value(argc, argv, &i, "--listen", &bad))) {
			listen_override = v;
		} else if ((v = flag_value(argc, argv, &i, "--job", &bad))) {
			job_name = v;
		} else if ((v = flag_value(argc, argv, &i, "--size", &bad))) {
			if (cfg_parse_bytes(v, &pp.size) || pp.size > (1ull << 40)) {
				fprintf(stderr, "meshrun: agent: --size wants a byte count like 64K or 16M, got '%s'\n", v);
				free(rest);
				return EXIT_USAGE;
			}
		} else if ((v = flag_value(argc, argv, &i, "--rounds", &bad))) {
			char *end;
			pp.rounds = strtol(v, &end, 10);
			if (*end || pp.rounds < 0) {
				fprintf(stderr, "meshrun: agent: --rounds wants a count, got '%s'\n", v);
				free(rest);
				return EXIT_USAGE;
			}
		} else if ((v = flag_value(argc, argv, &i, "--hold-s", &bad))) {
			char *end;
			pp.hold_s = strtod(v, &end);
			if (*end || pp.hold_s < 0 || pp.hold_s > 3600) {
				fprintf(stderr, "meshrun: agent: --hold-s wants seconds, got '%s'\n", v);
				free(rest);
				return EXIT_USAGE;
			}
		} else if (bad) {
			fprintf(stderr, "meshrun: agent: %s needs a value\n", argv[i]);
			free(rest);
			return EXIT_USAGE;
		} else {
			rest[nrest++] = argv[i];
		}
	}
	static struct train_job_arg train_arg;
	bool train = !strcmp(job_name, "train");
	if (train && (rc = run_parse_flags(&nrest, rest, &train_arg.opts, err, sizeof(err)))) {
		fprintf(stderr, "%s\n", err);
		free(rest);
		return rc;
	}
	rc = agent_args(&nrest, rest, &cfg, &host_id, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "meshrun: agent: %s\n", err);
		free(rest);
		return rc;
	}
	if (nrest > 1) {
		fprintf(stderr, "meshrun: agent: unknown argument '%s'\n", rest[1]);
		free(rest);
		return EXIT_USAGE;
	}
	free(rest);

	const struct job_entry *j = jobs;
	while (j->name && strcmp(j->name, job_name))
		j++;
	if (!j->name) {
		fprintf(stderr, "meshrun: agent: unknown job '%s' (this build has: train, pingpong)\n",
			job_name);
		return EXIT_USAGE;
	}
	if (train)
		run_blas_threads(&cfg, cfg.devices_per_host * run_agents_on_machine());
	rc = agent_run(&cfg, host_id, j->fn, train ? (void *)&train_arg : (void *)&pp, err,
		       sizeof(err));
	if (rc)
		fprintf(stderr, "meshrun: host %d: %s\n", host_id, err);
	return rc;
}
