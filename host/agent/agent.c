/* One host's agent (host/agent/agent.h): mesh, xport and net thread, one
 * thread per local device running the job, then a clean Done exchange or an
 * abort. Which job runs is the caller's choice. */
#include "host/agent/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "host/launch/status.h"
#include "host/util/threads.h"
#include "net/conn.h"
#include "net/net.h"

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

uint64_t agent_dcn_bytes_sent(struct agent *a)
{
	return a && a->net ? net_bytes_sent(a->net) : 0;
}

uint64_t agent_reconnects(struct agent *a)
{
	return a && a->net ? net_reconnects(a->net) : 0;
}

uint64_t agent_frames_resent(struct agent *a)
{
	return a && a->net ? net_frames_resent(a->net) : 0;
}

uint64_t agent_tls_key_updates(struct agent *a)
{
	return a && a->net ? net_key_updates(a->net) : 0;
}

void agent_link_security(struct agent *a, char *buf, size_t len)
{
	if (a && a->net)
		net_link_security(a->net, buf, len);
	else if (len)
		buf[0] = 0;
}

void agent_job_failed(struct device_ctx *d, int rc)
{
	char msg[640];
	snprintf(msg, sizeof(msg), "device %d: %s", d->device_id, d->err[0] ? d->err : "job failed");
	/* wakes the sibling devices and tells the other hosts; the first
	 * failure wins, so a second call changes nothing */
	net_abort(d->agent->net, rc, msg);
}

static void *device_main(void *p)
{
	struct device_ctx *d = p;
	struct agent *a = d->agent;
	char name[16];
	snprintf(name, sizeof(name), "mr-dev%d", d->local_index);
	pthread_setname_np(pthread_self(), name);
	int rc = a->job(d);
	if (rc)
		agent_job_failed(d, rc);
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

/* The launcher's status channel (host/launch/status.h), or -1. Consumed
 * like env_fd, and kept from anything this process starts. */
static int status_fd(void)
{
	const char *v = getenv(LAUNCH_STATUS_ENV);
	int fd = -1;
	if (v) {
		char *end;
		long x = strtol(v, &end, 10);
		if (!*end && x >= 0 && x < 65536 && fcntl((int)x, F_GETFD) >= 0)
			fd = (int)x;
		if (fd > 2)
			fcntl(fd, F_SETFD, FD_CLOEXEC);
		unsetenv(LAUNCH_STATUS_ENV);
	}
	return fd;
}

/* One line on the launcher's status channel (fd -1: none). */
static void status_write(int fd, const char *line)
{
	ssize_t w;
	if (fd < 0)
		return;
	do
		w = write(fd, line, strlen(line));
	while (w < 0 && errno == EINTR);
}

/* Tells the launcher which host this host's net declared lost, so it can
 * stop that host's agent at once (a stopped or hung one would otherwise
 * outlive the job). net reports the lost host only in its failure message
 * ("lost host 2 (127.0.0.1:7002): no heartbeat for 4.0 s"), and net/ has
 * no accessor for it, so the id is read from that message; any other
 * failure (an abort, a refused link) sends nothing. */
static void report_lost(struct net *n, int fd)
{
	char msg[512], line[64];
	int h;
	if (fd < 0 || net_failed(n, msg, sizeof(msg)) != NET_ERR_PEER_LOST ||
	    sscanf(msg, "lost host %d (", &h) != 1)
		return;
	snprintf(line, sizeof(line), "%s%d\n", LAUNCH_STATUS_LOST, h);
	status_write(fd, line);
}

static bool is_loopback(const char *host)
{
	return !strncmp(host, "127.", 4) || !strcmp(host, "localhost") || !strcmp(host, "::1");
}

/* Where this host accepts links: listen when given, else hosts[host_id],
 * else the port after the coordinator's plus host_id. */
static int listen_address(const struct cfg *cfg, const char *listen, int host_id, char *out,
			  size_t len, char *err, size_t errlen)
{
	char host[256];
	int port;
	if (listen) {
		snprintf(out, len, "%s", listen);
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

int agent_faults(const struct cfg *cfg, int num_hosts, struct fault_plan *p, char *err,
		 size_t errlen)
{
	char why[400];
	memset(p, 0, sizeof(*p));
	for (int i = 0; i < cfg->faults.n; i++)
		if (fault_parse(p, cfg->faults.item[i], num_hosts, why, sizeof(why))) {
			snprintf(err, errlen, "config: key 'faults': %s", why);
			return -EINVAL;
		}
	return 0;
}

/* The host's transport, its remote side the net: eager sends and how long
 * a waiting device thread polls its link as the config says. */
static struct xport *agent_xport(struct agent *a, const int *dev_host)
{
	const struct cfg *cfg = a->cfg;
	bool multi = a->mesh.num_hosts > 1;
	struct xport *x = xport_new(a->host_id, a->mesh.num_devices, dev_host,
				    multi ? net_xport_ops() : NULL, a->net);
	if (!x)
		return NULL;
	/* 8 small messages in flight to each host before one has to wait */
	xport_set_eager(x, (size_t)cfg->eager_max_bytes, 8 * (size_t)cfg->eager_max_bytes);
	/* a waiting device thread reads its link itself before it sleeps */
	xport_set_poll_spin(x, multi ? (uint64_t)cfg->poll_spin_us * 1000 : 0);
	/* /proc/loadavg counts the machine's threads: compare them with the
	 * CPUs the machine's agents share, not a bound agent's own share */
	xport_set_cores(x, util_cpus_shared());
	net_set_xport(a->net, x);
	return x;
}

/* The transport's parameters from the config, for host host_id. */
static struct net_params agent_net_params(const struct cfg *cfg, const struct mesh *m, int host_id,
					  const char *listen, const struct fault_plan *faults)
{
	enum aead_impl cipher = AEAD_IMPL_AUTO;
	aead_impl_parse(cfg->tls_cipher_impl, &cipher);     /* the config allows only its words */
	return (struct net_params){
		.host_id = host_id,
		.num_hosts = m->num_hosts,
		.devices_per_host = m->devices_per_host,
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
		.faults = faults,
		.replay_buffer_bytes = (uint64_t)cfg->replay_buffer_bytes,
		.reconnect_timeout_s = cfg->link_reconnect_timeout_s,
		.link_silence_s = cfg->link_silence_s,
		.poll_spin_us = (uint64_t)cfg->poll_spin_us,
		.max_send_bytes = (uint64_t)cfg->max_send_bytes,
		.p2p_handoff_bytes = (uint64_t)cfg->p2p_handoff_bytes,
		.notsent_lowat_bytes = (uint64_t)cfg->tcp_notsent_lowat_bytes,
		.openssl_records = !strcmp(cfg->tls_records, "openssl"),
		.tls_cipher = cipher,
		.link_streams = (int)cfg->link_streams,
	};
}

int agent_run(const struct cfg *cfg, int host_id, const char *listen_at, agent_job_fn job,
	      void *job_arg, char *err, size_t errlen)
{
	struct agent a = { .cfg = cfg, .host_id = host_id, .job = job };
	char listen[CFG_STR], why[512];
	int status = 0, report_fd = status_fd();
	int *dev_host = NULL;
	struct device_ctx *devs = NULL;
	pthread_t *threads = NULL;
	int started = 0;

	mesh_init(&a.mesh, cfg);
	if (host_id < 0 || host_id >= a.mesh.num_hosts) {
		snprintf(err, errlen, "host id %d is out of range: the mesh has %d hosts", host_id,
			 a.mesh.num_hosts);
		return -EINVAL;
	}
	if (listen_address(cfg, listen_at, host_id, listen, sizeof(listen), err, errlen))
		return -EINVAL;
	struct fault_plan faults;
	if (agent_faults(cfg, a.mesh.num_hosts, &faults, err, errlen))
		return -EINVAL;

	struct net_params p = agent_net_params(cfg, &a.mesh, host_id, listen, &faults);
	if (p.tls_cipher == AEAD_IMPL_IPSEC_MB && !aead_have_ipsec_mb()) {
		snprintf(err, errlen, "config: key 'tls_cipher_impl' is ipsec-mb, but this build has "
			 "no ipsec-mb (install libipsec-mb-dev and rebuild, or set it to auto)");
		return -EINVAL;
	}
	cfg_hash(cfg, p.config_hash);
	a.net = net_new(&p, &status, err, errlen);
	if (!a.net)
		return status;
	/* the certificate files are read: a launcher may remove them */
	status_write(report_fd, LAUNCH_STATUS_LOADED "\n");

	dev_host = malloc(sizeof(int) * (size_t)a.mesh.num_devices);
	devs = calloc((size_t)a.mesh.devices_per_host, sizeof(*devs));
	threads = calloc((size_t)a.mesh.devices_per_host, sizeof(*threads));
	if (!dev_host || !devs || !threads) {
		snprintf(err, errlen, "out of memory");
		status = -ENOMEM;
		goto out_free;
	}
	for (int d = 0; d < a.mesh.num_devices; d++)
		dev_host[d] = mesh_host_of(&a.mesh, d);
	a.x = agent_xport(&a, dev_host);
	if (!a.x) {
		snprintf(err, errlen, "out of memory");
		status = -ENOMEM;
		goto out_free;
	}

	status = net_start(a.net, err, errlen);
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
			net_abort(a.net, -EAGAIN, "unable to start a device thread");
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
		if (!give_up && net_failed(a.net, NULL, 0)) {
			give_up = now + DEVICE_GRACE_NS;
			report_lost(a.net, report_fd);
		}
		if (give_up && xport_now_ns() > give_up)
			break;
	}
	bool all_back = a.running == 0;
	pthread_mutex_unlock(&a.mu);
	if (!give_up)   /* the devices came back before the loop saw a failure */
		report_lost(a.net, report_fd);

	if (!all_back) {
		/* a device is stuck outside the transport: report and leave the
		 * process to exit around it (nothing it uses may be freed) */
		status = net_failed(a.net, why, sizeof(why));
		snprintf(err, errlen, "%s (a device thread did not stop)", why);
		return status ? status : -EIO;
	}
	for (int i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	pthread_mutex_destroy(&a.mu);
	pthread_cond_destroy(&a.cv);

	status = net_failed(a.net, err, errlen);
	if (!status)
		status = net_finish(a.net, err, errlen);

out_free:
	net_free(a.net);
	xport_free(a.x);
	free(dev_host);
	free(devs);
	free(threads);
	return status;
}

