/* See host/util/threads.h. */
#include "host/util/threads.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "host/config/config.h"
#include "kernels/kernels.h"

int util_agents_on_machine(void)
{
	const char *v = getenv("MESHRUN_LOCAL_AGENTS");
	int n = v ? atoi(v) : 1;
	return n > 0 ? n : 1;
}

int util_thread_nice(void)
{
	errno = 0;
	int v = getpriority(PRIO_PROCESS, (id_t)gettid());
	return errno ? 0 : v;
}

int util_device_nice(const struct cfg *c)
{
	int want = (int)c->device_nice;
	if (c->device_batch) {
		struct sched_param sp = { 0 };
		int rc = pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
		if (rc)
			return -rc;
	}
	if (want <= util_thread_nice())
		return 0;
	return setpriority(PRIO_PROCESS, (id_t)gettid(), want) ? -errno : 0;
}

int util_blas_threads(const struct cfg *c, int devices_on_machine)
{
	int cores = util_cpus_shared();
	int n = (int)c->openblas_threads;
	if (n <= 0) {
		n = cores / (devices_on_machine > 0 ? devices_on_machine : 1);
		if (n < 1)
			n = 1;
	}
	blas_set_threads(n);
	return n;
}

int util_cpus_shared(void)
{
	const char *v = getenv("MESHRUN_CPUS_SHARED");
	if (v && atoi(v) > 0)
		return atoi(v);
	cpu_set_t set;
	if (!sched_getaffinity(0, sizeof(set), &set) && CPU_COUNT(&set) > 0)
		return CPU_COUNT(&set);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	return cores > 0 ? (int)cores : 1;
}

int util_load_threads(void)
{
	const char *v = getenv("MESHRUN_LOAD_THREADS");
	if (v && atoi(v) > 0)
		return atoi(v) > 64 ? 64 : atoi(v);
	long n = util_cpus_shared() / util_agents_on_machine();
	return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

const char *util_blas_kernels_choice(const char *core)
{
	if (!core || strcmp(core, "Prescott"))
		return NULL;
#if defined(__x86_64__) && defined(__GNUC__)
	/* libgcc checks the OS saves the AVX / AVX-512 state (XGETBV) as
	 * well as the CPUID bits */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
		return "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
#endif
	return NULL;
}

int util_kernel_isa(char *err, size_t errlen)
{
	const char *v = getenv("MESHRUN_KERNEL_ISA");
	if (!v)
		return 0;
	for (int i = 0; i < KERNEL_ISA_COUNT; i++)
		if (!strcmp(v, kernel_isa_name((enum kernel_isa)i))) {
			if (!kernel_isa_set((enum kernel_isa)i))
				return 0;
			snprintf(err, errlen, "MESHRUN_KERNEL_ISA '%s': this CPU lacks it "
				 "(best: %s)", v, kernel_isa_name(kernel_isa_best()));
			return -EINVAL;
		}
	snprintf(err, errlen, "MESHRUN_KERNEL_ISA '%s': unknown (sse2, avx2 or avx512f)", v);
	return -EINVAL;
}

void util_blas_kernels(char **argv)
{
	if (getenv("OPENBLAS_CORETYPE"))
		return;
	const char *pick = util_blas_kernels_choice(blas_core_name());
	if (!pick)
		return;
	if (setenv("OPENBLAS_CORETYPE", pick, 1))
		return;
	execv("/proc/self/exe", argv);
	fprintf(stderr, "meshrun: could not re-execute with OPENBLAS_CORETYPE=%s (%s); "
		"running on OpenBLAS's Prescott kernels\n", pick, strerror(errno));
	unsetenv("OPENBLAS_CORETYPE");
}
