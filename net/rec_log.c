/* The per-record timeline; see net/rec_log.h. */
#include "net/rec_log.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#define REC_LOG_MAX (1u << 19)

struct ev {
	uint64_t t0, t1, seq, bytes;
	uint32_t tid;
	uint16_t lport, pport;
	int16_t cpu;
	uint8_t kind;
};

static struct ev *evs;
static _Atomic uint32_t nev;
static char dir[PATH_MAX];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void dump(void)
{
	char path[PATH_MAX + 32];
	snprintf(path, sizeof(path), "%s/rec.%d.log", dir, (int)getpid());
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	static const char *const names[] = { "seal", "open", "send", "recv", "irecv", "isend",
						    "wait", "poll", "park", "stream" };
	uint32_t n = atomic_load(&nev);
	if (n > REC_LOG_MAX)
		n = REC_LOG_MAX;
	for (uint32_t i = 0; i < n; i++) {
		const struct ev *e = &evs[i];
		fprintf(f, "%s %u %d %u %u %llu %llu %llu %llu\n", names[e->kind], e->tid, e->cpu,
			e->lport, e->pport, (unsigned long long)e->seq, (unsigned long long)e->bytes,
			(unsigned long long)e->t0, (unsigned long long)e->t1);
	}
	fclose(f);
}

static void setup(void)
{
	const char *d = getenv("MESHRUN_REC_LOG");
	if (!d || !*d || snprintf(dir, sizeof(dir), "%s", d) >= (int)sizeof(dir))
		return;
	evs = calloc(REC_LOG_MAX, sizeof(*evs));
	if (evs)
		atexit(dump);
}

bool rec_log_on(void)
{
	pthread_once(&once, setup);
	return evs != NULL;
}

uint64_t rec_log_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint16_t port_of(int fd, bool peer)
{
	struct sockaddr_storage a;
	socklen_t al = sizeof(a);
	if ((peer ? getpeername(fd, (struct sockaddr *)&a, &al)
		  : getsockname(fd, (struct sockaddr *)&a, &al)) != 0)
		return 0;
	return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
		     : ((struct sockaddr_in *)&a)->sin_port);
}

void rec_log(enum rec_log_kind k, int fd, uint32_t *ports, uint64_t seq, uint64_t bytes,
	     uint64_t t0)
{
	uint64_t t1 = rec_log_now();
	uint32_t i = atomic_fetch_add(&nev, 1);
	if (i >= REC_LOG_MAX)
		return;
	if (!*ports)
		*ports = (uint32_t)port_of(fd, false) << 16 | port_of(fd, true);
	uint32_t pp = *ports;
	evs[i] = (struct ev){ .t0 = t0, .t1 = t1, .seq = seq, .bytes = bytes,
			      .tid = (uint32_t)syscall(SYS_gettid), .cpu = (int16_t)sched_getcpu(),
			      .lport = (uint16_t)(pp >> 16), .pport = (uint16_t)pp,
			      .kind = (uint8_t)k };
}

void rec_mark(enum rec_log_kind k, uint64_t seq, uint64_t bytes, uint64_t t0)
{
	uint64_t t1 = rec_log_now();
	uint32_t i = atomic_fetch_add(&nev, 1);
	if (i >= REC_LOG_MAX)
		return;
	evs[i] = (struct ev){ .t0 = t0, .t1 = t1, .seq = seq, .bytes = bytes,
			      .tid = (uint32_t)syscall(SYS_gettid), .cpu = (int16_t)sched_getcpu(),
			      .kind = (uint8_t)k };
}
