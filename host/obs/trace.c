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

void trace_span(struct trace *t, const char *name, const char *cat, double t0, double t1)
{
	if (!t || !t->on || t->n >= TRACE_MAX_EVENTS)
		return;
	struct trace_event *e = &t->ev[t->n++];
	snprintf(e->name, sizeof(e->name), "%s", name);
	snprintf(e->cat, sizeof(e->cat), "%s", cat);
	e->ts_us = (t0 - t->t0) * 1e6;
	e->dur_us = (t1 - t0) * 1e6;
	e->step = t->step;
}

int trace_write(const char *path, const struct trace_event *ev, const int *counts,
		const int *host_of, int ndev, char *err, size_t errlen)
{
	cJSON *root = cJSON_CreateObject();
	cJSON *arr = cJSON_AddArrayToObject(root, "traceEvents");
	for (int d = 0; d < ndev; d++) {
		cJSON *m = cJSON_CreateObject();
		char name[32];
		snprintf(name, sizeof(name), "device %d", d);
		cJSON_AddStringToObject(m, "name", "thread_name");
		cJSON_AddStringToObject(m, "ph", "M");
		cJSON_AddNumberToObject(m, "pid", host_of[d]);
		cJSON_AddNumberToObject(m, "tid", d);
		cJSON *a = cJSON_AddObjectToObject(m, "args");
		cJSON_AddStringToObject(a, "name", name);
		cJSON_AddItemToArray(arr, m);
		for (int i = 0; i < counts[d]; i++) {
			const struct trace_event *e = &ev[(size_t)d * TRACE_MAX_EVENTS + i];
			cJSON *j = cJSON_CreateObject();
			cJSON_AddStringToObject(j, "name", e->name);
			cJSON_AddStringToObject(j, "cat", e->cat);
			cJSON_AddStringToObject(j, "ph", "X");
			cJSON_AddNumberToObject(j, "ts", e->ts_us);
			cJSON_AddNumberToObject(j, "dur", e->dur_us);
			cJSON_AddNumberToObject(j, "pid", host_of[d]);
			cJSON_AddNumberToObject(j, "tid", d);
			cJSON *args = cJSON_AddObjectToObject(j, "args");
			cJSON_AddNumberToObject(args, "step", (double)e->step);
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
