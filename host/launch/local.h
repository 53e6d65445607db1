/* The local backend of the launcher (host/launch/launch.h): N agents on
 * this machine, on loopback, with throwaway certificates. Used by `meshrun
 * local` and by the benchmarks that run agents (`bench link`, `bench
 * collectives`). It binds the coordinator and every link listener itself
 * on 127.0.0.1:0 and hands each child its sockets (MESHRUN_COORD_FD,
 * MESHRUN_DATA_FD), so no port is ever chosen and then raced for. */
#ifndef MESHRUN_LOCAL_H
#define MESHRUN_LOCAL_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

#include "host/launch/launch.h"

#define LOCAL_MAX_HOSTS 256

/* Starts `hosts` children named "host I", child I running
 *     <path of this binary> argv[0] ... argv[argc-1] --host-id I --hosts N
 *         certs_dir=<tmp> coordinator_address=127.0.0.1:<port>
 * with stdout/stderr inherited, MESHRUN_LOCAL_AGENTS=N,
 * MESHRUN_CPUS_SHARED (local_set_cpu_bind: each bound to its share of
 * the CPUs, or not) and a status
 * channel (MESHRUN_STATUS_FD: host/launch/status.h), then supervises
 * them with launch_run (o: grace and report words). Returns launch_run's
 * result, or -EINVAL (hosts out of [1, LOCAL_MAX_HOSTS]) or another -errno
 * when the certificates, listeners or children's arguments cannot be made;
 * err says what. The certificates live in a fresh 0700 directory under
 * $TMPDIR (or /tmp), keys 0600, the CA's key never written (nothing is
 * signed after they are made); the directory goes as soon as every agent
 * has read its files ("loaded" on the status channel), and at the latest
 * when local_launch returns. A SIGKILLed launcher leaves it only if it
 * died before every agent had loaded (the host keys and certificates, no
 * CA key); its agents die with it. */
int local_launch(int hosts, int argc, char **argv, const struct launch_opts *o,
		 struct launch_result *r, char *err, size_t errlen);

/* cpu_bind (configs/base.yml; README "Threads and cores"), mode one of
 * the key's values:
 * - "auto" (the default): with hosts >= 2 and hosts x devices_per_host
 *   <= the CPUs this process may use (sched_getaffinity), local_launch
 *   binds child I to local_cpu_share's share I of them before it execs,
 *   as mpirun binds its ranks (a device computes as a rank does); more
 *   devices than CPUs: every child may run on all of them (mpirun too
 *   binds none when oversubscribed).
 * - "spread": with hosts >= 2, child I is bound to local_cpu_spread's
 *   share I whatever the devices: hosts <= CPUs as auto's shares, more
 *   hosts than CPUs one CPU each, round-robin, so children I and I+1
 *   (pipeline and ring neighbours) never share a CPU when there are two
 *   or more. For emulating hosts that each have their own cores.
 * - "none": no child is bound.
 * Either way each child gets MESHRUN_CPUS_SHARED=<those CPUs' count>
 * (util_cpus_shared). The launchers call this after their config check. */
void local_set_cpu_bind(const char *mode, int devices_per_host);

/* Share i (0-based) of `all` among k agents: the CPUs of `all` in
 * number order cut into k runs of CPU_COUNT(all) / k, agent i the i-th
 * (any CPUs left over are in no share). Returns 0, or -1 when k < 1,
 * i is not in [0, k) or k exceeds CPU_COUNT(all). */
int local_cpu_share(const cpu_set_t *all, int k, int i, cpu_set_t *share);

/* cpu_bind spread's share i of `all` among k agents: with s = min(k,
 * CPU_COUNT(all)), local_cpu_share(all, s, i mod s). Returns 0, or -1
 * when k < 1, i is not in [0, k) or `all` is empty. */
int local_cpu_spread(const cpu_set_t *all, int k, int i, cpu_set_t *share);

#endif
