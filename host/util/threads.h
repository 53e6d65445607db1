/* How many OpenBLAS and checkpoint-loading threads a process gets: the
 * rules of README "Threads and cores". */
#ifndef MESHRUN_THREADS_H
#define MESHRUN_THREADS_H

#include <stddef.h>

struct cfg;

/* Sets OpenBLAS threads from openblas_threads or the rule
 * max(1, util_cpus_shared() / devices on this machine) (bound by
 * cpu_bind, an agent's own CPUs / its devices); returns the count. */
int util_blas_threads(const struct cfg *c, int devices_on_machine);

/* Raises the calling thread's nice value to c->device_nice (Linux:
 * nice is per thread; threads it starts later inherit it). A device
 * thread calls it once its communication threads exist, so they stay at
 * the process's nice, as the stream and net threads do, and a thread
 * woken by arriving bytes may take a computing device's core (README
 * "Threads and cores": off by default, as measured). Raising needs no
 * privilege; a thread already at or above it is left alone (lowering
 * would need CAP_SYS_NICE). With c->device_batch it also moves the
 * thread to SCHED_BATCH. Returns 0 or a negative errno. */
int util_device_nice(const struct cfg *c);

/* The calling thread's nice value. */
int util_thread_nice(void);

/* Agents sharing this machine: set by `meshrun local` for its children
 * (MESHRUN_LOCAL_AGENTS), else 1. */
int util_agents_on_machine(void);

/* The CPUs this machine's agents share: the count `meshrun local` passes
 * its children (MESHRUN_CPUS_SHARED: the CPUs the launcher may use, which
 * cpu_bind splits among them), else the CPUs this process may run on
 * (sched_getaffinity). A bound agent's own CPUs are its share of these. */
int util_cpus_shared(void);

/* Threads a process reads a checkpoint with (host/ckpt/hf_load.c): the
 * host's devices load one after another, so the whole process's share
 * of the machine, max(1, util_cpus_shared() / agents on the machine)
 * (at most 64: a bound agent's own CPUs); MESHRUN_LOAD_THREADS=N
 * overrides. */
int util_load_threads(void);

/* OpenBLAS picks its kernels when the library loads, before main. On a
 * CPU it does not know (Debian 12's 0.3.21 and the newest Xeons) it falls
 * back to "Prescott" (SSE3), 3-4x slower than the AVX-512 or AVX2
 * kernels the CPU has. Called first in main: if OPENBLAS_CORETYPE is
 * unset, OpenBLAS reports Prescott and the CPU (and the OS) support
 * AVX-512 (F, BW, VL, DQ) or AVX2 + FMA, sets OPENBLAS_CORETYPE to
 * SkylakeX or Haswell and re-executes the program with the same
 * arguments. Children inherit the variable; agents started over ssh
 * choose the same for themselves. OPENBLAS_CORETYPE set by the user
 * (even to Prescott) is left alone. Returns only when nothing changes or
 * the re-exec failed (then says so on stderr). */
void util_blas_kernels(char **argv);

/* The kernel name util_blas_kernels would choose on a CPU with OpenBLAS
 * reporting `core` (NULL: keep what OpenBLAS chose). Exposed for tests. */
const char *util_blas_kernels_choice(const char *core);

/* Our elementwise kernels run the widest vector instructions the CPU has
 * (kernels/isa.c; the same bits with any); MESHRUN_KERNEL_ISA=sse2, avx2
 * or avx512f picks one (for comparisons). Returns 0, or -EINVAL with err
 * naming a value that is unknown or that this CPU lacks. */
int util_kernel_isa(char *err, size_t errlen);

#endif
