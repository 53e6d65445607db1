/* Helpers shared by the collective and transport suites (check_coll,
 * check_coll_runs, check_xport, check_coll_agents): an in-process world of
 * D device threads on one transport that run a function each and report
 * their first failure, the inputs whose sums show the reduction order
 * (fval), $MESHRUN, and the agent of a host among a launcher's children.
 * Header-only, as tests/proc.h: each suite is one translation unit, and
 * `static inline` keeps a suite that does not use every helper free of
 * unused-function warnings. */
#ifndef MESHRUN_TESTS_COLL_UTIL_H
#define MESHRUN_TESTS_COLL_UTIL_H

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "net/coll.h"
#include "net/xport.h"

/* ---- an in-process world: one host, D device threads ---- */

struct world;
typedef void (*dev_fn)(struct world *w, int dev, struct coll_dev *cd);

struct world {
	int D;
	struct mesh m;
	struct xport *x;
	size_t seg, direct_max;
	double timeout_s;
	dev_fn fn;
	void *arg;
	pthread_mutex_t mu;
	int failures;
	char first[1024];
	/* per-device result pointers for cross-rank comparisons */
	float *res[8];
	pthread_barrier_t bar;
	int counter;
};

static inline void failf(struct world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void failf(struct world *w, const char *fmt, ...)
{
	pthread_mutex_lock(&w->mu);
	if (!w->failures++) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(w->first, sizeof(w->first), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&w->mu);
}

struct dev_arg {
	struct world *w;
	int dev;
};

static inline void *dev_main(void *p)
{
	struct dev_arg *da = p;
	struct world *w = da->w;
	struct coll_dev *cd = coll_dev_new(w->x, da->dev, w->seg, w->timeout_s);
	if (!cd) {
		failf(w, "coll_dev_new failed");
		return NULL;
	}
	coll_set_direct_max(cd, w->direct_max);
	w->fn(w, da->dev, cd);
	coll_dev_free(cd);
	return NULL;
}

/* mesh of one host with the given ici sizes (data, fsdp, tensor) */
static inline void world_mesh(struct world *w, int data, int fsdp, int tensor)
{
	struct cfg c;
	char err[256];
	cfg_defaults(&c);
	c.ici_data_parallelism = data;
	c.ici_fsdp_parallelism = fsdp;
	c.ici_tensor_parallelism = tensor;
	c.dcn_data_parallelism = 1;
	ck_assert_msg(cfg_finish(&c, 1, data * fsdp * tensor, err, sizeof(err)) == 0, "%s", err);
	mesh_init(&w->m, &c);
	w->D = w->m.num_devices;
}

static inline void world_run(struct world *w, dev_fn fn, void *arg)
{
	int hosts[8] = { 0 };
	pthread_t t[8];
	struct dev_arg da[8];
	w->x = xport_new(0, w->D, hosts, NULL, NULL);
	ck_assert_ptr_nonnull(w->x);
	w->fn = fn;
	w->arg = arg;
	w->failures = 0;
	w->first[0] = 0;
	w->counter = 0;
	pthread_mutex_init(&w->mu, NULL);
	pthread_barrier_init(&w->bar, NULL, (unsigned)w->D);
	for (int i = 0; i < w->D; i++) {
		da[i] = (struct dev_arg){ w, i };
		ck_assert_int_eq(pthread_create(&t[i], NULL, dev_main, &da[i]), 0);
	}
	for (int i = 0; i < w->D; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&w->bar);
	pthread_mutex_destroy(&w->mu);
	xport_free(w->x);
	w->x = NULL;
}

static inline void group_of(struct world *w, int dev, uint32_t axes, struct mesh_group *mg,
			    struct coll_group *g)
{
	mesh_group(&w->m, dev, axes, mg);
	g->id = mg->id;
	g->n = mg->n;
	g->rank = mg->rank;
	g->devs = mg->devs;
}

static inline void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		abort();
	return p;
}

#define CHECK_RC(w, rc, what, err) \
	do { \
		if (rc) { \
			failf(w, "%s: rc %d: %s", what, rc, err); \
			return; \
		} \
	} while (0)

/* Inputs for the checks of summation order (determinism, lists of runs). */
static inline float fval(int dev, size_t i)
{
	/* not integers: the summation order shows in the bits */
	return (float)sin((double)(dev * 1000003 + (long)i) * 0.37) * (float)(1 + dev);
}

/* ---- processes: $MESHRUN and the agents a launcher started ---- */

static inline const char *meshrun_path(void)
{
	const char *p = getenv("MESHRUN");
	ck_assert_msg(p && *p, "MESHRUN is not set (make test sets it to build/meshrun)");
	ck_assert_msg(access(p, X_OK) == 0, "%s is not an executable", p);
	return p;
}

/* The pid of the agent of host `host` among launcher's children, or -1:
 * local_launch starts each as `<exe> bench ... --host-id <h> ...`. */
static inline pid_t agent_of(pid_t launcher, int host)
{
	char want[16], path[300], buf[4096];
	pid_t found = -1;
	snprintf(want, sizeof(want), "%d", host);
	DIR *d = opendir("/proc");
	if (!d)
		return -1;
	struct dirent *e;
	while (found < 0 && (e = readdir(d))) {
		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		char *rp = strrchr(buf, ')');
		char state;
		int ppid;
		if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2 || ppid != launcher)
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
			if (!strcmp(buf + i, "--host-id") && i + 10 < n && !strcmp(buf + i + 10, want))
				found = (pid_t)atoi(e->d_name);
	}
	closedir(d);
	return found;
}

#endif
