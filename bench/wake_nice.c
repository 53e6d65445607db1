/* How late a sleeping thread runs when its timer fires while two threads
 * compute on the cores, by the computing threads' nice value and policy:
 * the scheduler question under device_nice / device_batch (README
 * "Threads and cores"), without meshrun. Two spinners (nice N, policy
 * normal|batch|idle) and a waiter that sleeps to an absolute time every
 * 5 ms, 400 times; prints the waiter's lateness percentiles.
 * usage: wake_nice NICE normal|batch|idle (bench/wake_nice.sh) */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 400

static int nice_v, policy;
static volatile int stop;

static void *spin(void *arg)
{
	(void)arg;
	setpriority(PRIO_PROCESS, (id_t)gettid(), nice_v);
	struct sched_param sp = { 0 };
	if (policy != SCHED_OTHER && pthread_setschedparam(pthread_self(), policy, &sp))
		perror("wake_nice: policy");
	volatile double x = 1;
	while (!stop)
		x = x * 1.0000001 + 1e-9;
	return NULL;
}

static long ns(struct timespec t)
{
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: wake_nice NICE normal|batch|idle\n");
		return 2;
	}
	nice_v = atoi(argv[1]);
	policy = !strcmp(argv[2], "batch") ? SCHED_BATCH : !strcmp(argv[2], "idle") ? SCHED_IDLE : SCHED_OTHER;
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, spin, NULL);
	usleep(200000);
	static long late[ROUNDS];
	struct timespec next, now;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (int i = 0; i < ROUNDS; i++) {
		next.tv_nsec += 5000000;
		if (next.tv_nsec >= 1000000000) {
			next.tv_nsec -= 1000000000;
			next.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
		late[i] = ns(now) - ns(next);
	}
	stop = 1;
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	qsort(late, ROUNDS, sizeof(long), cmp);
	double sum = 0;
	for (int i = 0; i < ROUNDS; i++)
		sum += (double)late[i];
	printf("spinners nice %2d %-6s waiter late, us: median %6.0f p90 %6.0f p99 %6.0f max %6.0f mean %6.0f\n", nice_v,
	       argv[2], late[ROUNDS / 2] / 1e3, late[ROUNDS * 9 / 10] / 1e3, late[ROUNDS * 99 / 100] / 1e3,
	       late[ROUNDS - 1] / 1e3, sum / ROUNDS / 1e3);
	return 0;
}
