/* The one monotonic clock of host/, and what this process has used: CPU
 * time and resident memory (peak and now). */
#ifndef MESHRUN_CLOCK_H
#define MESHRUN_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in seconds / nanoseconds. */
double util_now_s(void);
uint64_t util_now_ns(void);

/* User + system CPU time of this process (all threads), microseconds. */
double util_cpu_us(void);

/* Sleeps to end_ns on CLOCK_MONOTONIC (absolute: a signal cannot
 * shorten it), its last spin_ns spinning on the clock instead: a
 * sleeping thread wakes some tens of microseconds late (the timer's
 * interrupt, the wake-up; docs/pipeline.md, "Synthetic compute"), a
 * spinning one ends on time. 0 or -errno. */
int util_sleep_until_ns(uint64_t end_ns, uint64_t spin_ns);

/* CPU time of the calling thread, seconds. */
double util_thread_cpu_s(void);

/* The median of n timings (v is sorted in place; n > 0). */
double util_median(double *v, int n);

/* Peak resident set size of this process, MiB. */
long util_peak_rss_mb(void);
/* Resident set size of this process now (/proc/self/statm), MiB; -1
 * when it cannot be read. */
double util_rss_mb(void);

#endif
