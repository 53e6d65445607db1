/* See host/launch/local.h: what the local backend adds to the launcher
 * core is throwaway certificates, loopback listeners and the children's
 * arguments and environment. */
#include "host/launch/local.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/conn.h"
#include "net/tls.h"
#include "host/util/fs.h"

extern char **environ;

/* A listening socket on 127.0.0.1:0 (blocking, close-on-exec) and its
 * port. */
static int loopback_listener(int *port, char *err, size_t errlen)
{
	int fd;
	char addr[64], h[64];
	if (conn_listen("127.0.0.1:0", &fd, err, errlen))
		return -1;
	conn_sockname(fd, true, addr, sizeof(addr));
	if (conn_split_addr(addr, h, sizeof(h), port)) {
		close(fd);
		snprintf(err, errlen, "unable to read a listener's port");
		return -1;
	}
	return fd;
}

static void free_strv(char **v)
{
	if (!v)
		return;
	for (int i = 0; v[i]; i++)
		free(v[i]);
	free(v);
}

static char **child_env(int coord_fd, int data_fd)
{
	int n = 0;
	while (environ[n])
		n++;
	char **e = calloc((size_t)n + 4, sizeof(char *));
	if (!e)
		return NULL;
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (!strncmp(environ[i], "MESHRUN_COORD_FD=", 17) ||
		    !strncmp(environ[i], "MESHRUN_DATA_FD=", 16))
			continue;
		e[k++] = strdup(environ[i]);
	}
	char buf[64];
	/* OpenBLAS starts its worker pool when it is loaded and spins those
	 * threads for ~0.1 s; the agent then sets the number its rule chooses
	 * (util_blas_threads), and the pool grows to it. Starting from one keeps
	 * agents that never multiply (benches) from spinning cores at start. */
	if (!getenv("OPENBLAS_NUM_THREADS"))
		e[k++] = strdup("OPENBLAS_NUM_THREADS=1");
	if (coord_fd >= 0) {
		snprintf(buf, sizeof(buf), "MESHRUN_COORD_FD=%d", coord_fd);
		e[k++] = strdup(buf);
	}
	snprintf(buf, sizeof(buf), "MESHRUN_DATA_FD=%d", data_fd);
	e[k++] = strdup(buf);
	for (int i = 0; i < k; i++)
		if (!e[i]) {
			free_strv(e);
			return NULL;
		}
	return e;
}

/* Child i's argv: exe, the caller's arguments, then what the launcher
 * chooses. Every string owned. */
static char **child_argv(const char *exe, int argc, char **argv, int i, int hosts, const char *dir,
			 int port)
{
	char **v = calloc((size_t)argc + 8, sizeof(char *));
	char buf[PATH_MAX + 64];
	int n = 0;
	if (!v)
		return NULL;
	v[n++] = strdup(exe);
	for (int j = 0; j < argc; j++)
		v[n++] = strdup(argv[j]);
	v[n++] = strdup("--host-id");
	snprintf(buf, sizeof(buf), "%d", i);
	v[n++] = strdup(buf);
	v[n++] = strdup("--hosts");
	snprintf(buf, sizeof(buf), "%d", hosts);
	v[n++] = strdup(buf);
	snprintf(buf, sizeof(buf), "certs_dir=%s", dir);
	v[n++] = strdup(buf);
	snprintf(buf, sizeof(buf), "coordinator_address=127.0.0.1:%d", port);
	v[n++] = strdup(buf);
	for (int j = 0; j < n; j++)
		if (!v[j]) {
			free_strv(v);
			return NULL;
		}
	return v;
}

/* Certificates in dir, listeners and every child's argv and environment. */
static int make_children(struct launch_child *k, int hosts, int argc, char **argv, const char *dir,
			 char *err, size_t errlen)
{
	char exe[PATH_MAX], why[256];
	ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (el <= 0) {
		snprintf(err, errlen, "unable to find this binary: %s", strerror(errno));
		return -errno;
	}
	exe[el] = 0;
	if (tls_gen_certs(dir, hosts, why, sizeof(why))) {
		snprintf(err, errlen, "%s", why);
		return -EIO;
	}
	int port, data_port;
	int coord_fd = loopback_listener(&port, why, sizeof(why));
	if (coord_fd < 0) {
		snprintf(err, errlen, "coordinator listener: %s", why);
		return -EIO;
	}
	/* host 0 takes the coordinator's socket; until then it is host 0's */
	k[0].fds[k[0].nfds++] = coord_fd;
	for (int i = 0; i < hosts; i++) {
		snprintf(k[i].name, sizeof(k[i].name), "host %d", i);
		int fd = loopback_listener(&data_port, why, sizeof(why));
		if (fd < 0) {
			snprintf(err, errlen, "link listener: %s", why);
			return -EIO;
		}
		k[i].fds[k[i].nfds++] = fd;
		k[i].status = LAUNCH_STATUS_FD;
		k[i].argv = child_argv(exe, argc, argv, i, hosts, dir, port);
		k[i].envp = child_env(i == 0 ? coord_fd : -1, fd);
		if (!k[i].argv || !k[i].envp) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	}
	return 0;
}

static enum { BIND_NONE, BIND_AUTO, BIND_SPREAD } cpu_bind = BIND_AUTO;
static int cpu_bind_devices = 1;

void local_set_cpu_bind(const char *mode, int devices_per_host)
{
	cpu_bind = !strcmp(mode, "none") ? BIND_NONE : !strcmp(mode, "spread") ? BIND_SPREAD : BIND_AUTO;
	cpu_bind_devices = devices_per_host > 0 ? devices_per_host : 1;
}

int local_cpu_share(const cpu_set_t *all, int k, int i, cpu_set_t *share)
{
	int n = CPU_COUNT(all);
	if (k < 1 || i < 0 || i >= k || k > n)
		return -1;
	int per = n / k, seen = 0;
	CPU_ZERO(share);
	for (int c = 0; c < CPU_SETSIZE && seen < (i + 1) * per; c++)
		if (CPU_ISSET(c, all)) {
			if (seen >= i * per)
				CPU_SET(c, share);
			seen++;
		}
	return 0;
}

int local_cpu_spread(const cpu_set_t *all, int k, int i, cpu_set_t *share)
{
	int n = CPU_COUNT(all);
	if (k < 1 || i < 0 || i >= k || n < 1)
		return -1;
	int slots = k < n ? k : n;
	return local_cpu_share(all, slots, i % slots, share);
}

/* Binds child i to its share when cpu_bind and the count allow
 * (local_set_cpu_bind); shares: room for `hosts`. Sets
 * MESHRUN_CPUS_SHARED for the children either way: the launcher's
 * count, also for agents that spread puts on one CPU together, so every
 * thread rule counts as it does for floating agents. */
static void bind_children(struct launch_child *k, int hosts, cpu_set_t *shares)
{
	cpu_set_t all;
	char n[16];
	if (sched_getaffinity(0, sizeof(all), &all))
		return;
	snprintf(n, sizeof(n), "%d", CPU_COUNT(&all));
	setenv("MESHRUN_CPUS_SHARED", n, 1);
	if (cpu_bind == BIND_NONE || hosts < 2)
		return;
	/* auto: a device is what mpirun calls a rank: each computes on a core */
	if (cpu_bind == BIND_AUTO && (long)hosts * cpu_bind_devices > CPU_COUNT(&all))
		return;
	for (int i = 0; i < hosts; i++)
		if (!local_cpu_spread(&all, hosts, i, &shares[i]))
			k[i].cpus = &shares[i];
}

/* Every agent has read its certificate and key: the job's keys leave
 * the disk (launch_opts.all_loaded). */
static void certs_loaded(void *dir)
{
	util_remove_flat_dir(dir);
}

int local_launch(int hosts, int argc, char **argv, const struct launch_opts *o,
		 struct launch_result *r, char *err, size_t errlen)
{
	char dir[PATH_MAX], nagents[16];
	const char *tmp = getenv("TMPDIR");
	int rc;

	memset(r, 0, sizeof(*r));
	r->first = -1;
	if (hosts < 1 || hosts > LOCAL_MAX_HOSTS) {
		snprintf(err, errlen, "--hosts must be in [1, %d], got %d", LOCAL_MAX_HOSTS, hosts);
		return -EINVAL;
	}
	/* agents on this machine share its cores (README: threads and cores) */
	snprintf(nagents, sizeof(nagents), "%d", hosts);
	setenv("MESHRUN_LOCAL_AGENTS", nagents, 1);
	snprintf(dir, sizeof(dir), "%s/meshrun-local-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		snprintf(err, errlen, "unable to make a temporary directory: %s", strerror(errno));
		return -errno;
	}
	struct launch_child *k = calloc((size_t)hosts, sizeof(*k));
	if (!k) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto out;
	}
	cpu_set_t *shares = calloc((size_t)hosts, sizeof(*shares));
	if (!shares) {
		free(k);
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto out;
	}
	/* before the children's environments are made: MESHRUN_CPUS_SHARED */
	bind_children(k, hosts, shares);
	rc = make_children(k, hosts, argc, argv, dir, err, errlen);
	if (rc) {
		for (int i = 0; i < hosts; i++)
			for (int f = 0; f < k[i].nfds; f++)
				close(k[i].fds[f]);
	} else {
		struct launch_opts lo = *o;
		lo.all_loaded = certs_loaded;
		lo.loaded_ctx = dir;
		rc = launch_run(k, hosts, &lo, r, err, errlen);
	}
	for (int i = 0; i < hosts; i++) {
		free_strv(k[i].argv);
		free_strv(k[i].envp);
	}
	free(k);
	free(shares);
out:
	util_remove_flat_dir(dir);
	return rc;
}
