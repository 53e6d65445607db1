/* A per-record timeline of the TLS record layer, for measurement only
 * (bench/rec_timeline.py): with MESHRUN_REC_LOG=DIR in the environment,
 * each process keeps, in memory, one line per record sealed or opened
 * and per send() and recv() with data (CLOCK_MONOTONIC start and end,
 * thread, CPU, the socket's two ports, sequence number, bytes) and
 * writes them to DIR/rec.PID.log at exit. CLOCK_MONOTONIC is one clock
 * for every process of a machine, so two hosts' lines line up. Without
 * the variable every call is one load and a branch. Private to net/. */
#ifndef MESHRUN_REC_LOG_H
#define MESHRUN_REC_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum rec_log_kind {
	REC_SEAL, REC_OPEN, REC_SEND, REC_RECV,
	/* marks of a message's path beyond the socket (rec_mark): a posted
	 * receive, a posted send, a whole xport_wait, a poll that moved
	 * bytes, a sleep in park(), a stream thread's turn on a link */
	REC_IRECV, REC_ISEND, REC_WAIT, REC_POLL, REC_PARK, REC_STREAM,
};

/* Whether the log is on (the first call reads the environment). */
bool rec_log_on(void);
/* CLOCK_MONOTONIC in ns. */
uint64_t rec_log_now(void);
/* One event on socket fd from t0 to now; *ports caches the socket's two
 * ports (0: not asked yet), kept by the caller per connection. */
void rec_log(enum rec_log_kind k, int fd, uint32_t *ports, uint64_t seq, uint64_t bytes,
	     uint64_t t0);

/* An event of no socket (the marks above) from t0 to now. */
void rec_mark(enum rec_log_kind k, uint64_t seq, uint64_t bytes, uint64_t t0);

#endif
