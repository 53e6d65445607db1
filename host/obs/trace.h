/* Chrome trace-event spans (open the file in Perfetto or chrome://tracing):
 * each device records compute and communication spans into a bounded
 * buffer, on its own thread's row and one row per communication thread
 * (what ran in the background); at the end the buffers are gathered to device 0, which writes one
 * JSON file with a process per host and a thread per device. Times are
 * CLOCK_MONOTONIC microseconds since each device's start, taken right after
 * a barrier, so hosts line up to within one barrier's latency. */
#ifndef MESHRUN_TRACE_H
#define MESHRUN_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_MAX_EVENTS 16384
/* A device's other rows in the file: what its communication threads ran
 * in the background (category "flight": from when the thread started a
 * collective to when it finished, and before it "q NAME", how long it sat
 * queued), row r at tid r x TRACE_COMM_TID + device (1: the
 * collectives', 2: the batch split's expert exchanges', 3: a pipeline's
 * point-to-point messages, from post to completion) */
#define TRACE_COMM_TID 1000
/* the first of those rows: tid >= it is a flight track, tid % it the device */
#define TRACE_FLIGHT_TID TRACE_COMM_TID

struct trace_event {
	char name[24];
	char cat[8];          /* "compute", "comm" (the device waited), "flight", "pipeline", "step" */
	double ts_us, dur_us;
	int64_t step;
	int lane;             /* 0: the device's thread, 1-3: its communication rows */
	double cpu_us;        /* the thread's CPU time in the span (args.cpu_us), or < 0: not taken */
};

struct trace {
	bool on;
	double t0;
	int n;
	int64_t step;
	struct trace_event ev[TRACE_MAX_EVENTS];
};

void trace_start(struct trace *t, bool on);
/* Records [t0, t1) (util_now_s() seconds) as a span; drops spans past the cap;
 * t may be NULL (not tracing). */
void trace_span(struct trace *t, const char *name, const char *cat, double t0, double t1);
/* The same with the CPU seconds the device's thread spent in it (written
 * as args.cpu_us: on shared cores a span's wall time is not its cost). */
void trace_span_cpu(struct trace *t, const char *name, const char *cat, double t0, double t1, double cpu_s);
/* The same on the row of the device's communication thread `lane` (1 or
 * 2): a collective in flight in the background, category "flight". */
void trace_flight(struct trace *t, int lane, const char *name, double t0, double t1);
/* Writes the gathered events of every device: ev[d * TRACE_MAX_EVENTS ...],
 * counts[d], host_of[d], to path whole or not at all (host/util/out.h).
 * 0 or -errno with err naming the file. */
int trace_write(const char *path, const struct trace_event *ev, const int *counts,
		const int *host_of, int ndev, char *err, size_t errlen);

#endif
