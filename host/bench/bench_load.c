/* See host/bench/bench_load.h. */
#include "host/bench/bench_load.h"

#include <errno.h>
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
	if ((rc = hf_src_open(&src, c->load_parameters_path, 1, err, sizeof(err))))
		goto out;
	double t1 = util_now_s();
	for (int i = 0; i < D && !rc; i++)
		rc = hf_src_load(src, m[i], p[i], err, sizeof(err));
	/* one caller stands for the host's devices: they loaded one by one */
	rc = hf_src_done(src, rc, err, sizeof(err));
	double t2 = util_now_s(), cpu = (util_cpu_us() - cpu0) / 1e6;
	long faults = util_minor_faults() - f0, waits = preempted() - v0;
	if (!rc) {
		hf_src_summary(src, line, sizeof(line));
		printf("host %d: load %.3f s (headers %.3f s, tensors %.3f s), %.3f s CPU, %.1f MB/s read, "
		       "%d thread%s, %s, %ld minor faults, preempted %ld times; parameters %.0f MB made before "
		       "in %.3f s (%.3f s CPU, %ld minor faults, %s pages); %s\n", host_id, t2 - t0, t1 - t0, t2 - t1, cpu,
		       (double)hf_src_bytes_read(src) / 1e6 / (t2 - t0), util_load_threads(),
		       util_load_threads() == 1 ? "" : "s", hf_load_mmap() ? "mmap" : "pread", faults, waits, bytes / 1e6, t0 - ta, (cpu0 - cpua) / 1e6,
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
