/* See host/bench/bench_load.h. */
#include "host/bench/bench_load.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "host/ckpt/hf_load.h"
#include "host/config/config.h"
#include "host/mesh/mesh.h"
#include "host/mesh/shard.h"
#include "host/model/model.h"
#include "host/util/clock.h"
#include "host/util/mem.h"
#include "host/util/threads.h"

/* Times this process was preempted (involuntary context switches): a
 * load whose wall time grew while its CPU did not was waiting for a core. */
static long preempted(void)
{
	struct rusage r;
	return getrusage(RUSAGE_SELF, &r) ? 0 : r.ru_nivcsw;
}

/* One device's load, as train_job's load_weights does it. */
struct dev_load {
	struct hf_src *src;
	const struct model *m;
	float *p;
	int rc;
	char err[1024];
};

static void *dev_load(void *arg)
{
	struct dev_load *d = arg;
	d->rc = hf_src_load_done(d->src, d->m, d->p, d->err, sizeof(d->err));
	return NULL;
}

/* The host's D devices' loads: a thread each, as train's devices load
 * (the last one's load reads for all of them); with `copy`, one after
 * another on this thread, the source opened for one device. */
static int load_devices(struct hf_src *src, struct model **m, float **p, int D, bool copy, char *err,
			size_t errlen)
{
	static struct dev_load dl[64];  /* 64 KiB: not on the stack */
	pthread_t th[64];
	int rc = 0, started = 1;
	if (copy) {
		for (int i = 0; i < D && !rc; i++)
			rc = hf_src_load(src, m[i], p[i], err, errlen);
		return hf_src_done(src, rc, err, errlen);
	}
	for (int i = 0; i < D; i++)
		dl[i] = (struct dev_load){ .src = src, .m = m[i], .p = p[i] };
	while (started < D && !pthread_create(&th[started], NULL, dev_load, &dl[started]))
		started++;
	for (int i = started; i < D; i++) {  /* a thread that would not start: it fails, and so do the others */
		snprintf(dl[i].err, sizeof(dl[i].err), "bench load: unable to start device %d's thread", i);
		hf_src_done(src, -EAGAIN, dl[i].err, sizeof(dl[i].err));
	}
	dev_load(&dl[0]);
	for (int i = 1; i < started; i++)
		pthread_join(th[i], NULL);
	snprintf(err, errlen, "%s", dl[0].err);
	return dl[0].rc;
}

int bench_load_run(const struct cfg *c, int host_id)
{
	static struct mesh mesh;
	struct shard_rules *rules = malloc(sizeof(*rules));
	struct model_dims d;
	struct hf_src *src = NULL;
	struct model *m[64] = { 0 };
	float *p[64] = { 0 };
	char err[1024], line[1024];
	int D = c->devices_per_host, rc;
	if (!rules) {
		fprintf(stderr, "meshrun: bench load: out of memory\n");
		return -ENOMEM;
	}
	mesh_init(&mesh, c);
	if ((rc = shard_rules_from_cfg(rules, c, err, sizeof(err))) ||
	    (rc = model_dims_from_cfg(&d, c, err, sizeof(err))))
		goto out;
	if (mesh.size[AX_STAGE] > 1 || D > 64) {
		snprintf(err, sizeof(err), "bench load: a pipeline, or more than 64 devices per host, is not supported");
		rc = -EINVAL;
		goto out;
	}
	/* the devices' parameters, made as model_new makes them (zeroed,
	 * populated, util_big_alloc): the loader writes into memory that
	 * exists, as in training; the making is timed and counted apart */
	double ta = util_now_s(), cpua = util_cpu_us();
	long fa = util_minor_faults();
	size_t bytes = 0, pb[64] = { 0 };
	for (int i = 0; i < D; i++) {
		struct model_mesh mm = { .mesh = &mesh, .rules = rules, .device = mesh_device_of(&mesh, host_id, i) };
		if (!(m[i] = model_plan_new(&d, mesh.num_devices > 1 ? &mm : NULL, err, sizeof(err)))) {
			rc = -EINVAL;
			goto out;
		}
		size_t n = model_numel(m[i]);
		pb[i] = sizeof(float) * (n ? n : 1);
		if (!(p[i] = util_big_alloc(pb[i]))) {
			snprintf(err, sizeof(err), "bench load: out of memory: %zu bytes for the parameters",
				 sizeof(float) * n);
			rc = -ENOMEM;
			goto out;
		}
		bytes += sizeof(float) * n;
	}
	double t0 = util_now_s(), cpu0 = util_cpu_us();
	long f0 = util_minor_faults(), v0 = preempted();
	/* MESHRUN_BENCH_LOAD_COPY=1: the devices one after another as one
	 * device of the source, each batch run alone, so a second device
	 * copies the first one's blocks (the same-run baseline of reading a
	 * block once into both) */
	const char *cp = getenv("MESHRUN_BENCH_LOAD_COPY");
	bool copy = cp && !strcmp(cp, "1");
	if ((rc = hf_src_open(&src, c->load_parameters_path, copy ? 1 : D, err, sizeof(err))))
		goto out;
	double t1 = util_now_s();
	rc = load_devices(src, m, p, D, copy, err, sizeof(err));
	double t2 = util_now_s(), cpu = (util_cpu_us() - cpu0) / 1e6;
	long faults = util_minor_faults() - f0, waits = preempted() - v0;
	if (!rc) {
		hf_src_summary(src, line, sizeof(line));
		printf("host %d: load %.3f s (headers %.3f s, tensors %.3f s), %.3f s CPU, %.1f MB/s read, "
		       "%d thread%s, %s, %s, %ld minor faults, preempted %ld times; parameters %.0f MB made before "
		       "in %.3f s (%.3f s CPU, %ld minor faults, %s pages); %s\n", host_id, t2 - t0, t1 - t0, t2 - t1, cpu,
		       (double)hf_src_bytes_read(src) / 1e6 / (t2 - t0), util_load_threads(),
		       util_load_threads() == 1 ? "" : "s", hf_load_mmap() ? "mmap" : "pread",
		       util_stream_avx512() ? "avx512" : "sse2", faults, waits, bytes / 1e6, t0 - ta, (cpu0 - cpua) / 1e6,
		       f0 - fa, util_hugepages() ? "huge" : "4 KiB", line);
	}
out:
	if (rc)
		fprintf(stderr, "meshrun: bench load: host %d: %s\n", host_id, err);
	hf_src_close(src);
	for (int i = 0; i < 64; i++) {
		model_free(m[i]);
		util_big_free(p[i], pb[i]);
	}
	free(rules);
	return rc;
}
