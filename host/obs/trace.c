/* See host/obs/trace.h. JSON through cJSON. */
#include "host/obs/trace.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "host/util/clock.h"
#include "host/util/out.h"

void trace_start(struct trace *t, bool on)
{
	t->on = on;
	t->n = 0;
	t->step = -1;
	t->t0 = util_now_s();
}

static void span_on(struct trace *t, int lane, const char *name, const char *cat, double t0, double t1)
{
	if (!t || !t->on || t->n >= TRACE_MAX_EVENTS)
		return;
	struct trace_event *e = &t->ev[t->n++];
	snprintf(e->name, sizeof(e->name), "%s", name);
	snprintf(e->cat, sizeof(e->cat), "%s", cat);
	e->ts_us = (t0 - t->t0) * 1e6;
	e->dur_us = (t1 - t0) * 1e6;
	e->step = t->step;
	e->lane = lane;
	e->cpu_us = -1;
}

void trace_span(struct trace *t, const char *name, const char *cat, double t0, double t1)
{
	span_on(t, 0, name, cat, t0, t1);
}

void trace_span_cpu(struct trace *t, const char *name, const char *cat, double t0, double t1, double cpu_s)
{
	int n = t ? t->n : 0;
	span_on(t, 0, name, cat, t0, t1);
	if (t && t->n > n)
		t->ev[n].cpu_us = cpu_s * 1e6;
}

void trace_flight(struct trace *t, int lane, const char *name, double t0, double t1)
{
	span_on(t, lane, name, "flight", t0, t1);
}

/* The metadata event naming thread tid of process pid. */
static void thread_name(cJSON *arr, int pid, int tid, const char *name)
{
	cJSON *m = cJSON_CreateObject();
	cJSON_AddStringToObject(m, "name", "thread_name");
	cJSON_AddStringToObject(m, "ph", "M");
	cJSON_AddNumberToObject(m, "pid", pid);
	cJSON_AddNumberToObject(m, "tid", tid);
	cJSON *a = cJSON_AddObjectToObject(m, "args");
	cJSON_AddStringToObject(a, "name", name);
	cJSON_AddItemToArray(arr, m);
}

int trace_write(const char *path, const struct trace_event *ev, const int *counts,
		const int *host_of, int ndev, char *err, size_t errlen)
{
	cJSON *root = cJSON_CreateObject();
	cJSON *arr = cJSON_AddArrayToObject(root, "traceEvents");
	for (int d = 0; d < ndev; d++) {
		static const char *const row[4] = { "", "comm", "exchanges", "p2p" };
		char name[32];
		bool named[4] = { true, false, false, false };
		snprintf(name, sizeof(name), "device %d", d);
		thread_name(arr, host_of[d], d, name);
		for (int i = 0; i < counts[d]; i++) {
			const struct trace_event *e = &ev[(size_t)d * TRACE_MAX_EVENTS + i];
			int lane = e->lane >= 0 && e->lane < 4 ? e->lane : 0;
			int tid = lane * TRACE_COMM_TID + d;
			if (!named[lane]) {
				snprintf(name, sizeof(name), "device %d %s", d, row[lane]);
				thread_name(arr, host_of[d], tid, name);
				named[lane] = true;
			}
			cJSON *j = cJSON_CreateObject();
			cJSON_AddStringToObject(j, "name", e->name);
			cJSON_AddStringToObject(j, "cat", e->cat);
			cJSON_AddStringToObject(j, "ph", "X");
			cJSON_AddNumberToObject(j, "ts", e->ts_us);
			cJSON_AddNumberToObject(j, "dur", e->dur_us);
			cJSON_AddNumberToObject(j, "pid", host_of[d]);
			cJSON_AddNumberToObject(j, "tid", tid);
			cJSON *args = cJSON_AddObjectToObject(j, "args");
			cJSON_AddNumberToObject(args, "step", (double)e->step);
			if (e->cpu_us >= 0)
				cJSON_AddNumberToObject(args, "cpu_us", e->cpu_us);
			cJSON_AddItemToArray(arr, j);
		}
	}
	for (int h = 0, last = -1; h < ndev; h++) {
		if (host_of[h] == last)
			continue;
		last = host_of[h];
		cJSON *m = cJSON_CreateObject();
		char name[32];
		snprintf(name, sizeof(name), "host %d", host_of[h]);
		cJSON_AddStringToObject(m, "name", "process_name");
		cJSON_AddStringToObject(m, "ph", "M");
		cJSON_AddNumberToObject(m, "pid", host_of[h]);
		cJSON *a = cJSON_AddObjectToObject(m, "args");
		cJSON_AddStringToObject(a, "name", name);
		cJSON_AddItemToArray(arr, m);
	}
	char *text = cJSON_PrintUnformatted(root);
	cJSON_Delete(root);
	if (!text) {
		snprintf(err, errlen, "trace: out of memory");
		return -ENOMEM;
	}
	/* whole or not at all: a failed write leaves no partial trace */
	int rc = util_write_file("trace", path, text, strlen(text), err, errlen);
	cJSON_free(text);
	return rc;
}
