/* See host/util/threads.h. */
#include "host/util/threads.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "host/config/config.h"
#include "kernels/kernels.h"

int util_agents_on_machine(void)
{
	const char *v = getenv("MESHRUN_LOCAL_AGENTS");
	int n = v ? atoi(v) : 1;
	return n > 0 ? n : 1;
}

int util_blas_threads(const struct cfg *c, int devices_on_machine)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int n = (int)c->openblas_threads;
	if (n <= 0) {
		n = (int)(cores / (devices_on_machine > 0 ? devices_on_machine : 1));
		if (n < 1)
			n = 1;
	}
	blas_set_threads(n);
	return n;
}

int util_load_threads(void)
{
	const char *v = getenv("MESHRUN_LOAD_THREADS");
	if (v && atoi(v) > 0)
		return atoi(v) > 64 ? 64 : atoi(v);
	cpu_set_t set;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (!sched_getaffinity(0, sizeof(set), &set) && CPU_COUNT(&set) > 0)
		cores = CPU_COUNT(&set);
	long n = cores / util_agents_on_machine();
	return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}
