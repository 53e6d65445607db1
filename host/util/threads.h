/* How many OpenBLAS and checkpoint-loading threads a process gets: the
 * rules of README "Threads and cores". */
#ifndef MESHRUN_THREADS_H
#define MESHRUN_THREADS_H

struct cfg;

/* Sets OpenBLAS threads from openblas_threads or the rule
 * max(1, online cores / devices on this machine); returns the count. */
int util_blas_threads(const struct cfg *c, int devices_on_machine);

/* Agents sharing this machine: set by `meshrun local` for its children
 * (MESHRUN_LOCAL_AGENTS), else 1. */
int util_agents_on_machine(void);

/* Threads a process reads a checkpoint with (host/ckpt/hf_load.c): the
 * host's devices load one after another, so the whole process's share
 * of the machine, max(1, cores it may run on / agents on the machine)
 * (at most 64); MESHRUN_LOAD_THREADS=N overrides. */
int util_load_threads(void);

#endif
